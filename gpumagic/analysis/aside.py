"""A large trace's costliest metrics, computed in a forked child while this process does the rest.

The analysis runs on one core: at 860 MB of JSON (4.3M events) about 1.8 s after the trace is
assembled, while the second core waits. Two metrics take half of it, the critical path
(:mod:`gpumagic.analysis.critical_path`, 0.65 s) and the operators table
(:mod:`gpumagic.analysis.operators`, 0.25 s), and neither is needed until every other metric is
done. With ``workers`` > 1, :func:`start` forks a child (:mod:`gpumagic._forked`) that computes
them from the same context, inherited copy-on-write, while this process computes the other
metrics; :func:`take` then waits for the child's values instead of computing them here. The child
is forked before the context's step-time breakdown is computed (0.4 s; the context computes it on
first use, :class:`~gpumagic.analysis.context.Categories`): the child reads one category of it,
this process all of them. The values are the same either way (the same code on the same data;
the floats come back pickled, bit for bit), and a child that fails or cannot be made costs time
only: :func:`take` computes the value here then.

Only the command line asks for a child (``gpumagic analyze``: its process has no other thread by
then); :func:`gpumagic.analyze` in a notebook kernel keeps ``workers=1``, since a fork there could
copy a lock that one of the kernel's threads holds.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpumagic import _forked

if TYPE_CHECKING:
    from gpumagic.analysis.context import Context

#: Below this many events (the trace's table, after the profiler's own spans and flow arrows are
#: dropped) a child does not pay on every machine. Whole commands on the 2-core machine, 10 to 14
#: alternated runs each, with and without a child: idle, 12k events (the MI300X Falconsai step
#: ×3) 1.7 % slower with one, 25k (×6) the same, 44k to 123k 4 to 5 % faster; with two other
#: CPU-bound processes running, 44k and 67k (the ResNet-50 and A100 traces) about 8 % slower
#: (the child waits for a core while its work is a few tens of milliseconds), 123k (the V100
#: trace) about 10 % faster.
MIN_EVENTS = 100_000

#: The context's cache key that holds the running child (a :class:`gpumagic._forked.Child`) and
#: the keys it computes.
_CHILD = "aside.child"


def start(ctx: Context, work: Mapping[str, Callable[[Context], Any]], workers: int,
          shared: Callable[[Context], None] | None = None) -> bool:
    """Fork a child that computes ``{key: compute(ctx)}`` for each entry of ``work``, when
    ``workers`` > 1, the trace has at least :data:`MIN_EVENTS` events and a process can be had;
    whether one was started. ``shared(ctx)``, when given, runs first, only when a child is to be
    forked: it fills ``ctx.cache`` with what both processes would otherwise compute each.
    :func:`take` collects the values; :func:`finish` stops a child whose values were not taken
    (the analysis failed first)."""
    if workers < 2 or len(ctx.trace.events) < MIN_EVENTS or not hasattr(os, "fork") or _CHILD in ctx.cache:
        return False
    if shared is not None:
        shared(ctx)

    def in_the_child() -> dict[str, Any]:
        # a collection would walk (and so copy) every tracked object inherited from the parent
        gc.disable()
        return {key: compute(ctx) for key, compute in work.items()}

    try:
        ctx.cache[_CHILD] = (_forked.start(in_the_child), frozenset(work))
    except OSError:  # no process or file to spare: everything is computed here
        return False
    return True


def take(ctx: Context, key: str, compute: Callable[[Context], Any]) -> Any:
    """``ctx.cache[key]``, computed once: by the child :func:`start` made for ``ctx`` (waiting for
    it) when there is one that computes ``key``, else (or when it failed) by ``compute(ctx)`` in
    this process."""
    if key not in ctx.cache:
        if key in ctx.cache.get(_CHILD, ((), ()))[1]:
            values = _forked.wait(ctx.cache.pop(_CHILD)[0])
            if isinstance(values, dict):
                for k, v in values.items():
                    ctx.cache.setdefault(k, v)
        if key not in ctx.cache:
            ctx.cache[key] = compute(ctx)
    return ctx.cache[key]


def finish(ctx: Context) -> None:
    """Stop and reap the child of ``ctx`` if its values were never taken."""
    running = ctx.cache.pop(_CHILD, None)
    if running is not None:
        _forked.stop(running[0])


__all__ = ["MIN_EVENTS", "finish", "start", "take"]
