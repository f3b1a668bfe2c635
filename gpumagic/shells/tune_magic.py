"""``%gputune``: measure DataLoader settings for a dataset or loader from the notebook. A thin shell.

::

    %gputune train_dataset --batch-size 64
    %gputune train_loader --workers 0,2,4,8 --seconds 1 -o tuned
    %gputune train_dataset --rounds 4      # more interleaved rounds (ABAB...): tighter intervals on a busy machine

All the work is :func:`gpumagic.capture.dataloader.tune_dataloader`; this parses the line, evaluates the
expression in the user's namespace, and displays the result.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpumagic.capture.dataloader import DEFAULT_MAX_BATCHES, DEFAULT_ROUNDS, DEFAULT_SECONDS_PER_CONFIG
from gpumagic.errors import exception_text


@magics_class
class TunerMagics(Magics):
    """Holds the ``gputune`` line magic."""

    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", help="store the TuneResult in this variable")
    @argument("--workers", metavar="N,N,...", help="num_workers values to try (default: 0, 2, 4, ... up to the CPU count)")
    @argument("--pin-memory", choices=("both", "on", "off"), default="both",
              help="pin_memory values to try (default both; True is measured only with CUDA)")
    @argument("--prefetch", metavar="N,N,...", default="2", help="prefetch_factor values to try (default 2)")
    @argument("--batch-size", type=int, default=None, metavar="N", help="batch size (default: the loader's, or 64)")
    @argument("--seconds", type=float, default=DEFAULT_SECONDS_PER_CONFIG, metavar="S",
              help=f"time read per setting (default {DEFAULT_SECONDS_PER_CONFIG:g})")
    @argument("--max-batches", type=int, default=DEFAULT_MAX_BATCHES, metavar="N",
              help=f"batches read per setting at most (default {DEFAULT_MAX_BATCHES})")
    @argument("--rounds", type=int, default=DEFAULT_ROUNDS, metavar="N",
              help=f"interleaved rounds over the grid (ABAB; default {DEFAULT_ROUNDS}): --seconds and --max-batches "
                   "are shared out among them")
    @argument("--quiet", action="store_true", help="do not display the result")
    @argument("expression", nargs="+", help="a Dataset or DataLoader (any Python expression)")
    @needs_local_scope
    @line_magic
    def gputune(self, line: str = "", local_ns: dict | None = None) -> Any:
        """Measure batches per second for a grid of DataLoader settings and recommend one."""
        from gpumagic.capture.dataloader import tune_dataloader

        args = parse_argstring(self.gputune, line)
        if args.output is not None:
            from gpumagic.shells._names import output_name_problem

            problem = output_name_problem(args.output, self.shell.user_ns, getattr(self.shell, "user_ns_hidden", None))
            if problem is not None:
                raise UsageError(f"%gputune: {problem}")
        source = " ".join(args.expression)
        try:
            target = eval(source, self.shell.user_ns, local_ns)
        except Exception as exc:
            raise UsageError(f"%gputune: cannot evaluate {source!r}: {type(exc).__name__}: {exception_text(exc)}") from None
        try:
            result = tune_dataloader(
                target, num_workers=_int_list("--workers", args.workers), pin_memory=_pins(args.pin_memory),
                prefetch_factor=_int_list("--prefetch", args.prefetch), batch_size=args.batch_size,
                max_seconds_per_config=args.seconds, max_batches=args.max_batches, rounds=args.rounds)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%gputune: {exc}") from None
        if args.output:
            self.shell.user_ns[args.output] = result
        if not args.quiet:
            from IPython.display import display

            display(result)


def _int_list(option: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"%gputune: {option} takes comma-separated integers, not {text!r}") from None


def _pins(choice: str) -> tuple[bool, ...]:
    return {"both": (False, True), "on": (True,), "off": (False,)}[choice]


def load_ipython_extension(ipython) -> None:
    """Register ``%gputune`` (``gpumagic.shells.magic.load_ipython_extension`` calls this)."""
    ipython.register_magics(TunerMagics)


def unload_ipython_extension(ipython) -> None:
    ipython.magics_manager.magics["line"].pop("gputune", None)
    ipython.magics_manager.registry.pop("TunerMagics", None)
