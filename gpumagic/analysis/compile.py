"""``metrics.compile``: what torch.compile did in the cell (docs/metrics.md).

The counts and reasons come from the bundle's ``capture.dynamo`` block, which the capture reads
from dynamo's own counters and graph-break log before and after the cell
(:mod:`gpumagic.capture.dynamo`); ``compile_ms`` is the window's ``compile`` segments
(:mod:`gpumagic.analysis.segments`), so the two always agree. Dynamo records a guard failure for every
cached entry a call fails, newest first down to the frame's first entry (``entry`` 0), so a
recompilation is a run of failures that ends at entry 0; a run that stops earlier found an older
entry that fits, and compiled nothing. Bundles from before the entries were kept count every failure. With ``--modules``, the recompilation
its global hooks cause (a guard on their number) is left out: it is gpumagic's, not the code's. A trace without that block (not
recorded by gpumagic, or a cell that never compiled) has no ``metrics.compile``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from gpumagic.analysis import segments
from gpumagic.analysis.context import Context
from gpumagic.report.metrics import CompileMetrics, as_record
from gpumagic.trace.model import meta_block

#: A guard on the global module hooks, which ``--modules`` installs (capture/modules.py): dynamo
#: recompiles a module compiled before the capture once they appear.
_OUR_HOOKS = re.compile(r"_global_forward(_pre)?_hooks")
#: Reasons listed per kind, most frequent first.
MAX_REASONS = 20


def metrics(ctx: Context) -> CompileMetrics | None:
    capture = meta_block(ctx.trace.meta, "capture")
    facts = capture.get("dynamo")
    if not isinstance(facts, dict):
        return None
    compile_ns = sum(s.dur_ns for s in segments.segments(ctx).items if s.kind == "compile")
    graph_breaks = _count(facts.get("graph_breaks"))
    recompiles = [r for r in facts.get("recompiles") or [] if isinstance(r, dict)]
    if capture.get("modules") is True:  # --modules' own hooks: dynamo guards on their number
        recompiles = [r for r in recompiles if not _OUR_HOOKS.search(str(r.get("reason", "")))]
    cell = facts.get("compile_ms")
    runs = _recompilations(recompiles)
    first, few = _one_time(runs)
    return as_record({
        "compile_ms": round(compile_ns / 1e6, 4),
        "graph_breaks": graph_breaks,
        "break_reasons": _break_reasons(facts),
        "recompiles": len(runs),
        # each recompilation by its failure on the first entry compiled (the run's last): what changed since
        # the code was first compiled; the newest entry's may name an unrelated difference (a dtype
        # recompilation after a no_grad one quoted "grad_mode")
        "recompile_reasons": _grouped([run[-1] for run in runs]),
        "cell_compile_ms": float(cell) if isinstance(cell, (int, float)) and not isinstance(cell, bool) else None,
        "recompiles_first_change": first,
        "recompiles_few_values": few,
        "recompiles_dtype": sum(any(DTYPE_GUARD.search(str(r.get("reason", ""))) for r in run) for run in runs),
    }, CompileMetrics)


#: Guards that dynamo relaxes after their first failure when ``dynamic=None`` (automatic dynamic
#: shapes, PyTorch's "Dealing with Recompilations"): a tensor's size along one dimension, and an
#: integer argument (dynamo specialises ints at first, ``n == 0``; a bool is not made dynamic).
#: The tensor is named by its source in the frame: ``L['x']`` (a local), ``kwargs['input_ids']``
#: (a frame that takes ``**kwargs``, as transformers' forward wrappers do), or an attribute path
#: (``kwargs['cache'].layers[0].keys``, a key/value cache's tensor).
SIZE_GUARD = re.compile(r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)")
_INT = re.compile(r"^(?:(?:L|kwargs)\[')?(?P<name>[A-Za-z_]\w*)(?:'\])? == -?\d+(?:\s|$)")
_PLAIN = re.compile(r"^(?:(?:L|kwargs)\['(?P<key>[A-Za-z_]\w*)'\]|(?P<name>[A-Za-z_]\w*))$")


def plain_name(source: str) -> str | None:
    """The argument a guard's tensor source names, as the caller would spell it (``L['x']`` and
    ``kwargs['x']`` are ``x``); None for a path into an object (an attribute, an index)."""
    m = _PLAIN.match(source)
    return None if m is None else m.group("key") or m.group("name")


def _recompilations(failures: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The guard failures grouped into recompilations, each run newest entry first; a failure
    without an entry number (an older bundle) is one recompilation by itself."""
    runs: list[list[dict[str, Any]]] = []
    run: list[dict[str, Any]] = []
    where = None
    for r in failures:
        entry = r.get("entry")
        if (r.get("file"), r.get("line")) != where:  # another function: an unfinished run found its entry
            run, where = [], (r.get("file"), r.get("line"))
        if not isinstance(entry, int) or isinstance(entry, bool):
            runs.append([r])
            run = []
            continue
        run.append(r)
        if entry == 0:
            runs.append(run)
            run = []
    return runs


#: Guards on properties that take few values: a tensor's dtype, device, requires_grad or dispatch
#: keys (dynamo's ``TensorCheck`` messages: "dtype mismatch. expected Float, actual Double"), the
#: global state (grad mode, autocast: "GLOBAL_STATE changed: grad_mode") and a module's training
#: flag ("….training == True"). Dynamo keeps every compiled entry of a function (up to
#: ``torch._dynamo.config.recompile_limit``) and a call runs the first whose guards pass, so a
#: recompilation for one of these compiles the new value once; switching back reuses the entry
#: (seen here: six alternations of ``no_grad`` recompiled once).
FEW_VALUES_GUARD = re.compile(
    r"(?:dtype|device index|device|requires_grad|dispatch key set) mismatch|^GLOBAL_STATE changed|"
    r"\.training == (?:True|False)$")


#: A failed dtype guard (dynamo's ``TensorCheck``: "tensor 'x' dtype mismatch. expected Float, actual Double").
DTYPE_GUARD = re.compile(r"dtype mismatch")


def _one_time(runs: list[list[dict[str, Any]]]) -> tuple[int, int]:
    """How many recompilations met a size or integer that had not changed before in the same
    function (the one recompilation with which dynamo makes it dynamic), and how many others failed
    only guards of :data:`FEW_VALUES_GUARD`, on every entry they tried (a dtype, grad mode or eval
    mode compiled once, whose entry later calls reuse)."""
    seen: set[tuple[Any, ...]] = set()
    failed: set[tuple[Any, ...]] = set()  # runs already met: the same failures again means an entry was not reused
    first = few = 0
    for run in runs:
        key = tuple((r.get("file"), r.get("line"), str(r.get("reason", ""))) for r in run)
        again = key in failed
        failed.add(key)
        subjects = set()
        for r in run:
            reason = str(r.get("reason", ""))
            m = SIZE_GUARD.search(reason) or _INT.search(reason)
            if m is not None:
                subjects.add((r.get("file"), r.get("line"), m.group("name"), m.groupdict().get("dim")))
        new = subjects - seen
        seen |= subjects
        if new:
            first += 1
        elif not again and all(FEW_VALUES_GUARD.search(str(r.get("reason", ""))) for r in run):
            few += 1
    return first, few


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _break_reasons(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """From the log (reason, file, line); a reason the counter has but the log does not (logging
    was off in a child, or the cap was reached) is listed without a line."""
    logged = [r for r in facts.get("break_logs") or [] if isinstance(r, dict)]
    out = _grouped(logged)
    counts = facts.get("break_counts") or {}
    seen = {r["reason"].split(":", 1)[0] for r in out}
    for text, n in counts.items() if isinstance(counts, dict) else ():
        head = str(text).strip().splitlines()[0] if str(text).strip() else ""
        if head and head not in seen and _count(n):
            out.append({"reason": head, "file": None, "line": None, "count": _count(n)})
    return out[:MAX_REASONS]


def _grouped(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts = Counter((str(r.get("reason", "")), r.get("file") if isinstance(r.get("file"), str) else None,
                      r.get("line") if isinstance(r.get("line"), int) else None) for r in items)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0]))
    return [{"reason": k[0], "file": k[1], "line": k[2], "count": n} for k, n in ranked[:MAX_REASONS]]
