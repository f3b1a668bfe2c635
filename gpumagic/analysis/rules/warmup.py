"""``warmup-in-window``: the profiled window is partly start-up, not the steady loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumagic.analysis import everystep
from gpumagic.analysis import intervals as iv
from gpumagic.analysis import segments as sg
from gpumagic.analysis.context import Context
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import MISTAKES, Finding, Fix, Window
from gpumagic.trace.model import meta_block

#: Warm-up segments (cold start, graph capture, compilation, one-off host work) worth a finding
#: once they take this share of the window (the issue's line): a few-millisecond lead-in is not.
WARMUP_FRAC = 0.10
DOC = "https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule"
#: Warm-up filling this share of the window puts its finding first, whatever the others' gains:
#: most of what was recorded is not the loop they judge.
LEADS_FRAC = 0.5
_WORDS = {"cold_start": "cold start", "graph_capture": "graph capture", "compile": "compilation",
          "one_off_host": "one-off host work before the first launch"}
SKIP_CODE = "%%gpuprofile --skip 3\n# or: torch.profiler.schedule(wait=1, warmup=2, active=5)"
CAP_CODE = "%%gpuprofile --max-seconds 120"
#: vLLM's documented profiling entry points (docs "Profiling vLLM": set VLLM_TORCH_PROFILER_DIR
#: before creating the engine, then ``llm.start_profile()`` / ``llm.stop_profile()``): the engine
#: captures its CUDA graphs while it is created, so a profile started afterwards holds only serving.
SERVING_CODE = """
# The engine loads the model and captures its CUDA graphs while it starts: profile after that,
# on requests being served. vLLM (docs, "Profiling vLLM"), in the shell before the engine starts:
#   export VLLM_TORCH_PROFILER_DIR=./vllm_profile
# then in Python, after LLM(...) has returned and a few warm-up requests:
#   llm.start_profile(); outputs = llm.generate(prompts); llm.stop_profile()"""


@rule("warmup-in-window")
def warmup_in_window(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the window's warm-up segments (``analysis.segments``: cold start, graph capture,
    compilation, one-off host work; each needs positive evidence) take ≥ 10 % of the window.
    Context creation counts on any trace, counter-mode ones included. Gain: none. Their share of
    the window (the numbers' ``warmup_frac``) is how much the measured time overstates the steady
    state, not time the run would save: they do not recur, and recording later only leaves them out
    (a window that was all graph capture once read "Fixing all could save up to 100 %"). When they
    fill at least half the window (:data:`LEADS_FRAC`), the finding leads the checklist: the rest
    judge a sliver of it. The fix fits
    what was seen: skip more steps; for a serving engine, profile after its capture; for context
    creation and lazy loading nothing in the code needs fixing — start profiling later. False
    positives: a loop that really recompiles, re-captures or re-allocates every step (the
    segments then recur, and the fix is to stop that)."""
    seg = sg.segments(ctx)
    shares = seg.share()
    total = sum(shares.values())
    if total < WARMUP_FRAC:
        return None
    kinds = sorted(shares, key=lambda k: -shares[k])
    what = ", ".join(f"{_WORDS[k]} {pct(shares[k])}" for k in kinds)
    evidence = [e for s in sorted((s for s in seg.items if s.kind in shares), key=lambda s: -s.dur_ns)[:2]
                for e in s.evidence[:2]]
    serving = ctx.workload == "serving"
    fixes: list[Fix] = []
    capture = meta_block(ctx.trace.meta, "capture")
    if capture.get("stop_reason") == "cap" and not capture.get("optimizer_steps_seen"):
        cap = capture.get("max_seconds")
        which = f"{cap:g} s time cap" if isinstance(cap, (int, float)) else "time cap"
        fixes.append(pytorch(f"Recording stopped at the {which} before the first optimizer step: give the start more "
                             "time (skipped steps count against the cap too)", CAP_CODE))
    if "graph_capture" in shares and serving:
        fixes.append(pytorch("A serving engine captures its graphs once at start-up: profile after capture, "
                             "on requests being served", SERVING_CODE, diagnostic=True))
    if "cold_start" in shares and _compiled_before(ctx, seg):
        fixes.append(pytorch("Record more steps: this code was compiled before the profiler started (no "
                             "compilation in the cell), and compiled code's first call under a newly started "
                             "profiler is slow anyway (benchmarks/profiler_aftermath.py: about 100 ms for a 2 ms "
                             "step): a cost of profiling that skipping steps does not avoid, only dilutes",
                             PROFILER_START_CODE))
    skip_code = _skip_code(ctx, seg, capture)
    once = "cold_start" in shares or "one_off_host" in shares
    compiled = "compile" in shares or ("graph_capture" in shares and not serving)
    if once and compiled:  # one skip serves both: one fix, not the same snippet twice
        fixes.append(pytorch("Skip more steps before recording: compilation and graph capture happen in the first "
                             "calls, and so do context creation, lazy loading and imports, which need no fix in "
                             "the code", skip_code))
    elif once:
        fixes.append(pytorch("Nothing to fix in the code for context creation, lazy loading or imports: they "
                             "happen once. Start recording later, after a few steps", skip_code))
    elif compiled or not fixes:
        fixes.append(pytorch("Skip more steps before recording: compilation and graph capture happen in the first "
                             "calls", skip_code))
    steady = seg.steady_span
    judged = ("the steady-state findings judge only its steady part" if steady else
              "there is no steady part long enough to judge, so the steady-state findings are withheld")
    return finding(
        severity="low", title=f"{pct(total)} of the window is warm-up, not the steady loop",
        why=f"""The first calls of a PyTorch program pay one-off costs: {_one_off_costs(ctx)}. They do not
        recur, so a window that contains them overstates the step time and hides the real bottleneck;
        {judged}.""",
        summary=f"Warm-up takes {pct(total)} of the window: {what}. Evidence: " + "; ".join(evidence) + ".",
        numbers={**{k: round(v, 4) for k, v in shares.items()}, "warmup_frac": round(total, 4),
                 "steady_frac": round(seg.steady_frac, 4), "threshold_frac": WARMUP_FRAC},
        windows=tuple(_windows(ctx, seg)),
        est_gain=0.0, gain_method=(f"not a speed gain: {pct(total)} of the window is start-up that does not recur; "
                                   "recording later leaves it out of the measurement, and the run gets no faster"),
        fixes=tuple(fixes),
        doc_url=DOC,
    )


def _skip_code(ctx: Context, seg: sg.Segments, capture: dict[str, Any]) -> str:
    """The skip that leaves this window's warm-up out: a gpumagic capture recorded from step
    ``skip`` (its bundle's ``capture.skip``), so skipping as many more steps as there are recorded
    steps up to the one where the last warm-up segment ends (a recompilation in the first recorded
    step: one more) starts recording after it; unknown (a plain trace, a warm-up past the steps):
    :data:`SKIP_CODE`'s three, or one more than the capture skipped where that is not more."""
    skipped = capture.get("skip")
    if not isinstance(skipped, int) or isinstance(skipped, bool):
        return SKIP_CODE
    ends = [s.end_ns for s in seg.items if s.kind in _WORDS]
    starts = [lo for lo, _hi in ctx.step_bounds]
    steps_in = int(np.searchsorted(np.asarray(starts, np.int64), max(ends), side="left")) if ends and starts else 0
    suggested = skipped + steps_in if steps_in else max(skipped + 1, 3)
    return f"%%gpuprofile --skip {suggested}\n# or: torch.profiler.schedule(wait=1, warmup={max(suggested - 1, 1)}, active=5)"


#: Compiled code's cold start under the profiler: record more steps, so that the one slow call is a
#: small part of the window.
PROFILER_START_CODE = "%%gpuprofile --steps 20"
COMPILED_REGION = "Torch-Compiled Region"


def _compiled_before(ctx: Context, seg: sg.Segments) -> bool:
    """The cold start's evidence is a compiled region's first call, and the step timer (a gpumagic
    capture) saw no compilation in the cell: the code compiled before the profiler started, and
    the slow first call is the profiler's start (``benchmarks/profiler_aftermath.py``)."""
    if not any(COMPILED_REGION in e for s in seg.items if s.kind == "cold_start" for e in s.evidence):
        return False
    block = everystep.block_of(ctx)
    return block is not None and not any(e["kind"] == "compile" for e in block["events"])


def _one_off_costs(ctx: Context) -> str:
    """The one-off costs of a program's first calls on this trace's device: a CPU-only run has no
    CUDA context, kernel modules or CUDA graphs."""
    if ctx.device < 0:
        return ("allocating the memory later steps reuse, initialising libraries and thread pools, compiling "
                "(torch.compile) and starting DataLoader worker processes")
    return ("creating the CUDA context, loading kernel modules, creating library handles, compiling "
            "(torch.compile), autotuning (cudnn.benchmark) and capturing CUDA graphs")


def _windows(ctx: Context, seg: sg.Segments) -> tuple[Window, ...]:
    w = [s for s in seg.items if s.kind in sg.WARMUP_KINDS]
    return windows([s.start_ns for s in w], [s.end_ns for s in w], "cpu", -1, "warm-up")


def warmup_intervals(ctx: Context) -> iv.Intervals:
    """The warm-up segments of the window, as intervals."""
    w = [s for s in sg.segments(ctx).items if s.kind in sg.WARMUP_KINDS]
    return iv.union(np.array([s.start_ns for s in w], dtype=np.int64), np.array([s.end_ns for s in w], dtype=np.int64))


def lead_with_warmup(findings: list[Finding]) -> list[Finding]:
    """The sorted findings, the warm-up one first when warm-up fills at least :data:`LEADS_FRAC`
    of the window (it claims no speed gain, so the gain order would put it last) — after the
    mistakes in what the code computes (``report.model.MISTAKES``), which lead every list."""
    lead = [f for f in findings if f.id == "warmup-in-window"
            and float(f.evidence.numbers.get("warmup_frac") or 0.0) >= LEADS_FRAC]
    mistakes = [f for f in findings if f.id in MISTAKES]
    return mistakes + lead + [f for f in findings if f not in lead and f not in mistakes]
