"""``%gputimeit`` / ``%%gputimeit``: time a statement or a cell on the device it runs on. A thin shell.

::

    %gputimeit y = model(x)
    %gputimeit -o t --max-seconds 2 torch.mm(a, b)
    %gputimeit --compare "torch.mm(a16, b16)" torch.mm(a, b)

The measurement is :func:`gpumagic.capture.timeit.measure`: CUDA events and a synchronise around
each repetition once the process uses CUDA, the wall clock on the CPU, warm-up timed apart, and
repetitions until the 95 % interval is tight or ``--max-seconds`` is spent. Unlike ``%timeit``, the
code runs in the user's namespace (what it assigns stays assigned), and ``-o NAME`` names the
variable the result is stored under.
"""

from __future__ import annotations

import os
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope, output_can_be_silenced
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split

from gpumagic.capture.timeit import DEFAULT_MAX_SECONDS, DEFAULT_WARMUP, DEVICES, measure
from gpumagic.shells._names import output_name_problem
from gpumagic.shells._options import _valued_options, split_options


@magics_class
class TimeitMagics(Magics):
    """Holds the ``gputimeit`` magic."""

    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", help="store the TimeitResult in this variable")
    @argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, metavar="S",
              help=f"time budget for warm-up and repetitions (default {DEFAULT_MAX_SECONDS:g})")
    @argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N",
              help=f"warm-up calls, timed apart from the samples (default {DEFAULT_WARMUP})")
    @argument("--compare", metavar="STATEMENT", help="a second statement (quoted), timed interleaved with the "
              "first: says which is faster, with an interval on the ratio")
    @argument("--device", choices=DEVICES, default="auto",
              help="clock: cuda (CUDA events), cpu (wall clock), auto (CUDA events once the process uses CUDA)")
    @argument("-q", "--quiet", action="store_true", help="print nothing (with -o)")
    @argument("statement", nargs="*", help="line magic only: the statement to time")
    @needs_local_scope
    @line_cell_magic
    @output_can_be_silenced
    def gputimeit(self, line: str = "", cell: str | None = None, local_ns: dict | None = None) -> Any:
        """Time a statement (``%gputimeit [options] statement``) or a cell (``%%gputimeit [options]``)
        correctly for the GPU: the median per call with its 95 % interval, the spread, and the
        warm-up apart."""
        __tracebackhide__ = True
        if cell is None:
            options_text, source = split_options(line, _valued_options(self.gputimeit.parser))
        else:
            options_text, source = line, cell
        try:
            argv = arg_split(options_text, posix=os.name != "nt")
        except ValueError as exc:
            raise UsageError(f"%gputimeit: cannot read the options ({exc}): {options_text}") from None
        args = self.gputimeit.parser.parse_args(argv)
        if cell is not None and args.statement:
            raise UsageError("%%gputimeit takes options only; put the code in the cell below it")
        if not source.strip():
            raise UsageError("%gputimeit needs code: `%gputimeit [options] statement` or a %%gputimeit cell")
        if args.output is not None:
            problem = output_name_problem(args.output, self.shell.user_ns, getattr(self.shell, "user_ns_hidden", None))
            if problem is not None:
                raise UsageError(f"%gputimeit: {problem}")
        if args.compare is not None and not args.compare.strip():
            raise UsageError("%gputimeit --compare needs a statement")
        if not args.max_seconds > 0 or args.warmup < 0:
            raise UsageError("%gputimeit: --max-seconds must be positive and --warmup 0 or more")
        fn = self._function(source, local_ns)
        other = None if args.compare is None else (args.compare, self._function(args.compare, local_ns))
        try:
            result = measure(source.strip(), fn, max_seconds=args.max_seconds, warmup=args.warmup,
                             device=args.device, other=other)
        except ValueError as exc:  # --device cuda without CUDA
            raise UsageError(f"%gputimeit: {exc}") from None
        if args.output:
            self.shell.user_ns[args.output] = result
        if not args.quiet:
            print(result.to_text())
        return None

    def _function(self, source: str, local_ns: dict | None):
        """The code, transformed and compiled as IPython runs a cell (a SyntaxError here costs
        nothing), as a function of no arguments that runs it in the user's namespace."""
        shell = self.shell
        text = shell.transform_cell(source)
        tree = shell.transform_ast(shell.compile.ast_parse(text))
        filename = shell.compile.cache(text, shell.execution_count, raw_code=source)
        code = shell.compile(tree, filename, "exec")
        user_ns = shell.user_ns

        def run() -> None:
            __tracebackhide__ = True
            exec(code, user_ns, local_ns)

        return run


def load_ipython_extension(ipython) -> None:
    """Register ``%gputimeit`` (``gpumagic.shells.magic.load_ipython_extension`` calls this)."""
    ipython.register_magics(TimeitMagics)


def unload_ipython_extension(ipython) -> None:
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("gputimeit", None)
    ipython.magics_manager.registry.pop("TimeitMagics", None)
