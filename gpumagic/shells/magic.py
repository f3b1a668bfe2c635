"""``%%gpuprofile`` / ``%gpuprofile``: profile a notebook cell or one statement. A thin shell.

Load with ``%load_ext gpumagic``. The cell runs the way IPython's ``%%time`` runs it: transformed,
compiled with the shell's compiler (so tracebacks show the cell's lines), executed in the user
namespace, and its last expression's value returned, so the cell's ``Out`` still shows it.
Everything else (recording, samplers, report) lives in :mod:`gpumagic.capture`.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope, output_can_be_silenced
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split

from gpumagic.capture import CaptureError, CaptureOptions, CaptureSession, Run
from gpumagic.capture.monitor import profiled_window
from gpumagic.capture.options import DEFAULT_INTERVAL_MS, DEFAULT_MAX_SECONDS, DEFAULT_RECORD_STEPS, DEFAULT_SKIP_STEPS
from gpumagic.capture.session import finish_after
from gpumagic.errors import exception_text
from gpumagic.shells._names import output_name_problem
from gpumagic.shells._options import _valued_options, split_options


@magics_class
class GpuProfileMagics(Magics):
    """Holds the ``gpuprofile`` magic."""

    @magic_arguments()
    @argument("-o", "--output", metavar="NAME", help="store the Report in this variable")
    @argument("--label", default="", help="name the run (shown in the report; every run that completes is "
              "kept in the run history, also across kernel restarts: see `gpumagic runs`)")
    @argument("--compare", metavar="LABEL", help="after the run, compare it with a run of the history: LABEL (its "
              "latest run), LABEL@N (its N-th most recent) or r<id>")
    @argument("--quiet", action="store_true", help="do not display the report")
    @argument("--save", metavar="PATH", help="write the trace bundle here (.json or .json.gz) for "
              "`gpumagic analyze`")
    @argument("--skip", type=int, default=DEFAULT_SKIP_STEPS, metavar="K",
              help=f"optimizer steps left unrecorded as warm-up (default {DEFAULT_SKIP_STEPS})")
    @argument("--steps", type=int, default=DEFAULT_RECORD_STEPS, metavar="N",
              help=f"optimizer steps recorded; then the code runs on unprofiled (default {DEFAULT_RECORD_STEPS})")
    @argument("--all", action="store_true", dest="all_steps",
              help="record the whole cell: every step, no skip, no step limit, no time cap")
    @argument("--max-seconds", type=float, default=None, metavar="S",
              help=f"recording cap while no optimizer step has run (default {DEFAULT_MAX_SECONDS:g})")
    @argument("--interval-ms", type=int, default=DEFAULT_INTERVAL_MS, metavar="MS",
              help=f"NVML and host CPU sampling period (default {DEFAULT_INTERVAL_MS})")
    @argument("--no-nvml", action="store_true", help="do not sample the GPU through NVML")
    @argument("--no-loader-stages", action="store_true",
              help="do not time the DataLoader's stages (dataset, transforms, collate, pinning)")
    @argument("--shapes", action="store_true", help="record operator input shapes (adds overhead)")
    @argument("--flops", action="store_true", help="record the profiler's FLOP counts and shapes, for "
              "achieved TFLOP/s and MFU (adds overhead)")
    @argument("--top-ops", type=int, default=20, metavar="N",
              help="operators listed in the report's Operators table, by GPU time (default 20)")
    @argument("--stack", action="store_true", help="record Python call stacks (adds overhead)")
    @argument("--memory", action="store_true", help="record allocator events and memory by category (adds overhead)")
    @argument("--batch-size", type=int, default=None, help="the batch size, for the out-of-memory finding's estimate "
              "and the energy per sample")
    @argument("--accumulation-steps", type=int, default=1, help="batches per optimizer step (gradient "
              "accumulation), for the energy per sample (default 1)")
    @argument("--modules", action="store_true", help="time each nn.Module's forward and backward "
              "(metrics.modules, the Modules tab; slows module calls)")
    @argument("statement", nargs="*", help="line magic only: the statement to profile")
    @needs_local_scope
    @line_cell_magic
    @output_can_be_silenced
    def gpuprofile(self, line: str = "", cell: str | None = None, local_ns: dict | None = None) -> Any:
        """Profile a cell's GPU and CPU activity and show why the GPU waits.

        ``%%gpuprofile [options]`` profiles the cell below; ``%gpuprofile [options] statement``
        profiles one statement. Training loops are found through their optimizer steps.
        """
        __tracebackhide__ = True  # IPython leaves this frame out of the cell's tracebacks
        args, source = self._parse(line, cell)
        baseline = _baseline(args.compare)  # an unknown label fails before anything runs
        code = self._compile(source)
        session = CaptureSession(_capture_options(args), namespaces=(self.shell.user_ns, local_ns))  # names models
        try:
            _start(session)  # inside the try: an interrupt just after it still finishes the session
            with profiled_window(args.label):  # shaded on the live monitor (%gpumonitor), if one runs
                value = _execute(code, self.shell.user_ns, local_ns)
        except BaseException as exc:  # a failed start left nothing running: nothing to show
            self._show_partial(session, exc, args, baseline)
            raise
        run = session.finish()
        # The cell has run: from here on nothing may cost it its report (one warning line instead)
        try:
            _trainer_first(run)
        except Exception as exc:
            _warn(f"the fixes were not phrased for transformers.Trainer ({type(exc).__name__}: {exception_text(exc)})")
        if run.report is not None and not run.taken_over:
            from gpumagic.shells.api import record_run

            reason = record_run(run, source="magic", warn=False)  # every completed run goes into the history
            if reason is not None:
                _warn(f"this run was not stored in the run history: {reason}")
        self._show(run, args, baseline)
        return value

    def _show_partial(self, session: CaptureSession, error: BaseException, args, baseline) -> None:
        """Finish after the code raised and show the partial report; nothing raised here (not even
        a second Ctrl-C) replaces the code's own exception, which the caller re-raises."""
        if session.state in ("new", "finished"):
            return
        try:
            self._show(finish_after(session, error), args, baseline)
        except BaseException as exc:  # the code's exception is the one the user must see
            print(f"gpumagic: the partial report was not shown ({type(exc).__name__}: {exception_text(exc)})", file=sys.stderr)

    def _parse(self, line: str, cell: str | None):
        if cell is None:
            options_text, source = split_options(line, _valued_options(self.gpuprofile.parser))
        else:
            options_text, source = line, cell
        args = _parse_options(self.gpuprofile.parser, options_text)
        if cell is not None and args.statement:
            raise UsageError("%%gpuprofile takes options only; put the code in the cell below it")
        if args.output is not None:
            problem = output_name_problem(args.output, self.shell.user_ns, getattr(self.shell, "user_ns_hidden", None))
            if problem is not None:
                raise UsageError(f"%gpuprofile: {problem}")
        if not source.strip():
            raise UsageError("%gpuprofile needs code: `%gpuprofile [options] statement` or a %%gpuprofile cell")
        return args, source

    def _compile(self, source: str):
        """Transform and compile the code before profiling starts (a SyntaxError costs nothing)."""
        shell = self.shell
        text = shell.transform_cell(source)
        tree = shell.transform_ast(shell.compile.ast_parse(text))
        filename = shell.compile.cache(text, shell.execution_count, raw_code=source)
        body, last = split_last_expression(tree)
        body_code = shell.compile(body, filename, "exec")
        last_code = None if last is None else shell.compile(last, filename, "eval")
        return body_code, last_code

    def _show(self, run: Run, args, baseline=None) -> None:
        if run.save_error:
            print(f"gpumagic: warning: the bundle was not saved: {run.save_error}", file=sys.stderr)
        if run.analysis_warning:
            _warn(run.analysis_warning)
        if run.report is None:
            return
        if args.output:
            self.shell.user_ns[args.output] = run.report
        if not args.quiet:
            from IPython.display import display

            if baseline is not None:  # the answer first, the full report collapsed under it
                from gpumagic.render.display import show_comparison
                from gpumagic.tuning.comparison import compare

                try:
                    show_comparison(compare(baseline, run.report), run.report)
                    return
                except Exception as exc:  # the comparison is extra: the report itself is still shown
                    _warn(f"the comparison with --compare {args.compare} was not shown "
                          f"({type(exc).__name__}: {exception_text(exc)})")
            display(run.report)


def _warn(message: str) -> None:
    """One warning line on stderr, as for a bundle that was not saved."""
    print(f"gpumagic: warning: {message}", file=sys.stderr)


def _start(session: CaptureSession) -> None:
    try:
        session.start()
    except CaptureError as exc:
        raise UsageError(str(exc)) from None


def _parse_options(parser, options_text: str):
    """The options as shell words (quotes removed, as a shell would), parsed; UsageError on
    unterminated quotes or bad options (IPython's argument parser raises it)."""
    try:
        argv = arg_split(options_text, posix=os.name != "nt")
    except ValueError as exc:  # shlex: "No closing quotation"
        raise UsageError(f"%gpuprofile: cannot read the options ({exc}): {options_text}") from None
    return parser.parse_args(argv)


def _execute(code, user_ns: dict, local_ns: dict | None) -> Any:
    __tracebackhide__ = True
    body_code, last_code = code
    exec(body_code, user_ns, local_ns)
    return None if last_code is None else eval(last_code, user_ns, local_ns)


def split_last_expression(tree: ast.Module) -> tuple[ast.Module, ast.Expression | None]:
    """The cell without its last statement when that statement is an expression, and that
    expression (as IPython's ``%%time`` does, so the value can be returned)."""
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        return ast.Module(body=tree.body[:-1], type_ignores=[]), ast.Expression(tree.body[-1].value)
    return tree, None


def _capture_options(args) -> CaptureOptions:
    _save_not_over_history(args.save)
    try:
        return CaptureOptions(
            label=args.label or "", skip=args.skip, steps=args.steps, all_steps=args.all_steps,
            max_seconds=args.max_seconds, interval_ms=args.interval_ms, nvml=not args.no_nvml,
            shapes=args.shapes, stack=args.stack, memory=args.memory, save=args.save,
            flops=args.flops, top_ops=args.top_ops, loader_stages=not args.no_loader_stages,
            batch_size=args.batch_size, accumulation_steps=args.accumulation_steps, modules=args.modules)
    except CaptureError as exc:
        raise UsageError(f"%gpuprofile: {exc}") from None


def _save_not_over_history(save) -> None:
    """``--save`` names a file the bundle replaces: never the run history (or its side files)."""
    if not save:
        return
    from gpumagic._atomic import WriteError, refuse_inputs
    from gpumagic.tuning.history import kept_files

    try:
        refuse_inputs(save, kept_files())
    except (WriteError, OSError, ValueError) as exc:
        raise UsageError(f"%gpuprofile --save: {exc}") from None


def _baseline(label: str | None):
    """The report of the history's run that ``--compare LABEL`` names (UsageError naming the known labels)."""
    if label is None:
        return None
    from gpumagic.tuning import runs

    try:
        return runs.get(label)
    except (runs.UnknownRunError, runs.HistoryError, ValueError) as exc:
        raise UsageError(f"%gpuprofile --compare: {exc}") from None


def _trainer_first(run: Run) -> None:
    """When this kernel uses ``transformers.Trainer``, phrase the fixes as TrainingArguments first."""
    from gpumagic.analysis.advice.huggingface import huggingface_fixes
    from gpumagic.shells.hf_callback import trainer_imported

    if run.report is not None and trainer_imported():
        run.report = huggingface_fixes(run.report)


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpumagic``: register the magic and quiet Kineto's logging."""
    from gpumagic.capture.quiet import quiet_kineto

    quiet_kineto()
    ipython.register_magics(GpuProfileMagics)
    from gpumagic.shells.tune_magic import TunerMagics

    ipython.register_magics(TunerMagics)
    from gpumagic.shells.monitor import MonitorMagics

    ipython.register_magics(MonitorMagics)
    from gpumagic.shells.timeit_magic import TimeitMagics

    ipython.register_magics(TimeitMagics)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext gpumagic``: remove the magic."""
    magics = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        magics[kind].pop("gpuprofile", None)
    magics["line"].pop("gputune", None)
    for kind in ("line", "cell"):
        magics[kind].pop("gputimeit", None)
    ipython.magics_manager.registry.pop("TimeitMagics", None)
    magics["line"].pop("gpumonitor", None)
    ipython.magics_manager.registry.pop("MonitorMagics", None)
    ipython.magics_manager.registry.pop("TunerMagics", None)
    ipython.magics_manager.registry.pop("GpuProfileMagics", None)
