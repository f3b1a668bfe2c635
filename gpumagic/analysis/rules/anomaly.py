"""``anomaly-detection-on``: autograd's anomaly mode, a debugging switch, left on while training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpumagic.analysis import intervals as iv
from gpumagic.analysis.context import Context
from gpumagic.analysis.cpuprecision import holders
from gpumagic.analysis.rules.base import finding, pct, pytorch, rule, severity_for, windows
from gpumagic.report.metrics import Metrics
from gpumagic.report.model import Finding
from gpumagic.trace.links import EVALUATE_PREFIX

#: What anomaly mode's NaN check runs on each output of a backward node (the autograd engine,
#: ``torch/csrc/autograd/engine.cpp``, when ``AnomalyMode::should_check_nan()``; recorded here as
#: ``aten::isnan``, then ``aten::_is_any_true`` around ``aten::any``, then ``aten::item``, inside the
#: node's span): ``aten::isnan`` marks it. Its error, "Function '…' returned nan values in its 0th
#: output", is the one users meet.
CHECK = "aten::isnan"
CHECK_CHAIN = frozenset({"aten::isnan", "aten::any", "aten::item"})
#: Nodes with outputs to check: every evaluated node but gradient accumulation into a leaf.
LEAF_NODE = "AccumulateGrad"
#: At least this many checked nodes, and at least this share of the nodes with outputs: a user's
#: own ``torch.isnan`` in one custom backward is not the mode.
MIN_CHECKED = 4
MIN_CHECKED_SHARE = 0.5
DOC = "https://pytorch.org/docs/stable/autograd.html#anomaly-detection"
#: benchmarks/anomaly_mode.py on this project's 2-core machine, alternated rounds.
MEASURED = ("benchmarks/anomaly_mode.py: a CPU MLP step took 2.5x as long with anomaly mode on, 0.61 saved by "
            "turning it off, where its NaN checks took 0.20 of the profiled window")


@dataclass(frozen=True)
class AnomalyChecks:
    checked: int  # backward nodes holding a NaN check
    nodes: int  # backward nodes with outputs (all but AccumulateGrad)
    isnan_calls: int
    spans: iv.Intervals  # the check chain's time inside the nodes' spans


def anomaly_checks(ctx: Context) -> AnomalyChecks | None:
    """Anomaly mode's NaN checks in the window, when they show the mode (see the rule); None
    otherwise. ``host-sync`` leaves the syncs inside them to this finding."""
    return ctx.memo("anomaly_checks", _find)


def _find(ctx: Context) -> AnomalyChecks | None:
    ev, msk = ctx.trace.events, ctx.masks
    ops = ctx.events_in_window(msk["cpu_op"] & msk["host"])
    evaluate = ctx.host_name_ids(lambda n: n.startswith(EVALUATE_PREFIX))[ev.name] & ops
    leaf = ctx.host_name_ids(lambda n: n.startswith(EVALUATE_PREFIX) and LEAF_NODE in n)[ev.name]
    nodes = np.flatnonzero(evaluate & ~leaf)
    checks = np.flatnonzero(ops & ctx.host_name_ids(lambda n: n == CHECK)[ev.name])
    if nodes.size == 0 or checks.size < MIN_CHECKED:
        return None
    checked = holders(ev, nodes, checks)
    if checked < MIN_CHECKED or checked < MIN_CHECKED_SHARE * nodes.size:
        return None
    spans = ctx.intervals(ops & ctx.host_name_ids(CHECK_CHAIN.__contains__)[ev.name])
    return AnomalyChecks(checked, int(nodes.size), int(checks.size), iv.intersect(spans, ctx.intervals(evaluate)))


@rule("anomaly-detection-on")
def anomaly_detection_on(ctx: Context, m: Metrics) -> Finding | None:
    """Signal: the autograd engine's spans (``autograd::engine::evaluate_function: …``) hold
    ``aten::isnan`` calls — anomaly mode's NaN check of every backward output — in ≥ 4 of them and
    ≥ half of those that have outputs (all but ``AccumulateGrad``). Any device: on a GPU each check
    reads a value on the host (``.item()``), a sync per backward node. Gain, an estimate that runs
    low: the check chain's time (``isnan``, ``any``, ``item`` inside those spans) in the window;
    the mode also records a Python stack trace for every forward operation that builds the
    backward graph, which no operator span shows (measured in ``benchmarks/anomaly_mode.py``). Fix: turn it off; PyTorch's docs
    say the mode is for debugging only. False positives: a custom backward that tests its own
    outputs for NaN in most nodes."""
    found = anomaly_checks(ctx)
    if found is None:
        return None
    checked, nodes, calls, inside = found.checked, found.nodes, found.isnan_calls, found.spans
    gain = ctx.frac(iv.total(inside))
    gpu = ctx.device >= 0
    return finding(
        severity=severity_for(gain),
        title="Autograd's anomaly detection is on: every backward step is checked for NaN",
        why="""torch.autograd.set_detect_anomaly(True), or a detect_anomaly() block, makes the backward pass test
        every output of every node for NaN and makes the forward pass record a Python stack trace for every
        operation it adds to the backward graph, so that an error can name the line that caused it. PyTorch's
        documentation says the mode should be enabled only for debugging: its checks slow the program down."""
            + (" On a GPU each check reads its answer on the host: one sync per backward node." if gpu else ""),
        summary=(f"{checked} of {nodes} backward nodes with outputs ran anomaly mode's NaN check "
                 f"({calls} isnan calls); the checks take {pct(gain)} of the window."),
        numbers={"checked_nodes": checked, "backward_nodes": nodes, "isnan_calls": calls,
                 "check_frac": round(gain, 4)},
        windows=windows(*inside, "cpu", label="NaN check"),
        est_gain=gain,
        gain_method=("estimate that runs low: the NaN checks' time inside the backward pass (isnan, any, item); "
                     f"the forward's stack traces add more, unseen as operators ({MEASURED})"),
        fixes=(pytorch("Turn anomaly detection off outside debugging (remove the call, or the detect_anomaly() "
                       "block around the loop)", "torch.autograd.set_detect_anomaly(False)   # on only to find a NaN's "
                       "origin, then off"),),
        doc_url=DOC,
    )


__all__ = ["anomaly_detection_on"]
