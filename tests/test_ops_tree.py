"""The operator tree (flops._Ops): the vectorised parents are the stack walk's, on nested,
touching, empty and overlapping spans, and on the real fixtures' operators; and the shapes column
(columns.json_column), decoded once per distinct text."""

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tracebuilder import DATA

from gpumagic.analysis import flops
from gpumagic.trace import load


def parents_both(lane, ts, dur):
    lane, ts, dur = (np.asarray(x, dtype=t) for x, t in ((lane, np.int32), (ts, np.int64), (dur, np.int64)))
    end = ts + dur
    order = np.lexsort((-dur, ts, lane))
    walk = flops._stack_parents(lane, ts, end, order)
    p = flops._nested_parents(lane[order], ts[order], end[order], dur[order])
    if p is None:
        return walk, None
    fast = np.full(lane.size, -1, dtype=np.int64)
    fast[order] = np.where(p >= 0, order[np.maximum(p, 0)], -1)
    return walk, fast


spans = st.lists(st.tuples(st.integers(-1, 2), st.integers(0, 30), st.integers(0, 12)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(spans)
def test_nested_parents_are_the_walks_or_refuse(items):
    """Random spans (many overlap without nesting): the fast path either gives the walk's parents
    exactly or declines (None), never a different tree."""
    lane, ts, dur = zip(*items) if items else ((), (), ())
    walk, fast = parents_both(lane, ts, dur)
    if fast is not None:
        assert fast.tolist() == walk.tolist()


def _nested(rng, lane, lo, hi, depth, out):
    """Properly nested spans in [lo, hi): children inside their parent, some touching, some empty."""
    t = lo
    while t < hi and len(out) < 400:
        d = int(rng.integers(0, max(1, (hi - t) // 2) + 1))
        out.append((lane, t, d))
        if depth and d > 2:
            _nested(rng, lane, t, t + d, depth - 1, out)
        t += d + int(rng.integers(0, 3))


def test_nested_spans_take_the_fast_path():
    rng = np.random.default_rng(7)
    for seed in range(20):
        out: list = []
        for lane in range(3):
            _nested(rng, lane, 0, 1000 + seed, 4, out)
        lane, ts, dur = zip(*out)
        walk, fast = parents_both(lane, ts, dur)
        assert fast is not None, "properly nested spans must not fall back"
        assert fast.tolist() == walk.tolist()
        assert (walk >= 0).any()


def test_fixture_trees_are_the_walks():
    for name in ("resnet50_v100_workers0.json.gz", "a100_training_rank0.json.gz", "mi300_falconsai_infer.json.gz"):
        t = load(os.path.join(DATA, name)).ops
        tree = flops._Ops(t)
        end = t.ts_ns + t.dur_ns
        order = np.lexsort((-t.dur_ns, t.ts_ns, t.lane))
        assert tree.parent.tolist() == flops._stack_parents(t.lane, t.ts_ns, end, order).tolist()
        walked: dict[int, list[int]] = {}
        for i in order.tolist():  # children in walk order, as the walk appended them
            if tree.parent[i] >= 0:
                walked.setdefault(int(tree.parent[i]), []).append(i)
        assert {p: tree.children(p) for p in walked} == walked
        assert not any(tree.children(i) for i in range(len(t)) if i not in walked)
        for j in list(walked.get(next(iter(walked)), []))[:3]:  # one link up from a child to its parent
            assert tree.steps_up(j, int(tree.parent[j])) == 1
        assert flops._Ops.of(t) is flops._Ops.of(t)


def test_json_column_decodes_each_distinct_text_once():
    """The same values as decoding each raw text alone; equal texts share one list; absent,
    non-list and (in a column with a broken value) malformed texts give the default."""
    import msgspec

    from gpumagic.trace.columns import json_column

    raws = [msgspec.Raw(b"[[2, 3], []]"), msgspec.Raw(b""), msgspec.Raw(b"[[2, 3], []]"), msgspec.Raw(b"7"),
            msgspec.Raw(b'["float"]')]
    out = json_column(raws, [])
    assert out == [[[2, 3], []], [], [[2, 3], []], [], ["float"]]
    assert out[0] is out[2]
    assert json_column(raws, None)[1] is None
    broken = json_column([msgspec.Raw(b"[1, 2]"), msgspec.Raw(b"[1,"), msgspec.Raw(b"[1, 2]")], None)
    assert broken == [[1, 2], None, [1, 2]]
    assert json_column([], []) == []
