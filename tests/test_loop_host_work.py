"""``loop-host-work``: a CPU-only training loop's own code between the optimizer step and the next
forward pass (per-step bookkeeping in Python), and the phase split it reads: the forward pass
starts at its first operator that the backward undoes, not at the step's first operator."""

from __future__ import annotations

import glob
import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.rules.loopwork import MAX_WAITING_USE, MIN_FRAC, MIN_STEP_MS

RECORDED = os.path.join(DATA, "cpu_loop_host_work.json.gz")
RANDOM_INPUTS = os.path.join(DATA, "cpu_loop_random_inputs.json.gz")
PREPARE = os.path.join(DATA, "cpu_loop_prepare.json.gz")
FROM_LISTS = os.path.join(DATA, "cpu_loop_from_lists.json.gz")


def test_a_recorded_loop_that_counts_accuracy_in_python():
    """benchmarks/loop_work.py --passes 150 (tests/data/MANIFEST.md): the tensor fix saved 0.31."""
    r = analyze(RECORDED)
    f = r.finding("loop-host-work")
    n = f.evidence.numbers
    assert MIN_FRAC <= f.est_gain == n["loop_work_frac"] < 0.5
    assert n["loop_work_step_ms"] >= MIN_STEP_MS and n["no_operator_frac"] > 0.9
    assert "aten::argmax" in f.evidence.summary  # the bookkeeping's one operator, on the last step's output
    assert f.gain_method.startswith("estimate")
    # the phases agree: the Python loop is "other", not the model's forward
    med = r.metrics.phases.median_ms
    # most of "other": the rest are the gaps between the model's phases
    assert 0.85 * med.other <= n["loop_work_step_ms"] <= med.other
    assert med.forward < med.backward


@pytest.mark.parametrize("path", sorted(set(glob.glob(os.path.join(DATA, "*.json.gz"))) - {RECORDED, RANDOM_INPUTS, PREPARE,
                                                                                         FROM_LISTS}))
def test_silent_on_every_other_recorded_trace(path):
    """cpu_checkpoint_every_step.json.gz spends half its window in torch.save between the steps:
    the step timer's saves are left out (they are frequent-checkpoints')."""
    assert analyze(path).finding("loop-host-work") is None


def _training(bookkeeping_us: float, steps: int = 6, cc=None, backward: bool = True,
              per_tensor: tuple[str, ...] = (), tensors: int = 0, op_us: float = 10, from_python_us: float = 0,
              random_us: float = 0, prepare: tuple[str, ...] = (), noise_add: bool = False):
    """CPU training steps of 1 ms of model work each, after ``bookkeeping_us`` of the loop's own
    code (an argmax, then Python) that opens each step; with ``per_tensor``, those in-place
    operators of ``op_us`` each on every one of ``tensors`` tensors there (a Python loop: an EMA);
    with ``from_python_us``, two tensors built from Python lists there, each filled for that long
    (``aten::empty``, the fill, ``aten::to``, ``aten::lift_fresh``, as ``torch.tensor`` records it);
    with ``random_us``, an ``aten::randn`` of that long there (holding its ``aten::normal_``); with
    ``prepare``, those operators of 400 µs each there (the batch cast and normalized); with
    ``noise_add``, the draw scaled and added to the batch (an ``aten::mul`` and an ``aten::add``
    of 30 µs each: a denoising autoencoder's noisy input)."""
    tb = TraceBuilder(cc=cc)
    t = 0.0
    for k in range(steps):
        dur = 1000 + bookkeeping_us
        tb.step(k + 1, t, dur)
        tb.op("Optimizer.zero_grad#SGD.zero_grad", t + 1, 4, cat="user_annotation")
        tb.op("aten::argmax", t + 6, 10)
        at = t + 20
        for _ in range(2 if from_python_us else 0):
            tb.op("aten::empty", at + 100, 2)  # after the walk through the list
            tb.op("aten::to", at + 102 + from_python_us, 1)
            tb.op("aten::lift_fresh", at + 104 + from_python_us, 1)
            at += 110 + from_python_us
        for name in prepare:
            tb.op(name, at, 400)
            at += 405
        if random_us:
            tb.op("aten::randn", at, random_us)
            tb.op("aten::normal_", at + 2, random_us - 4)
            at += random_us + 5
            for name in ("aten::mul", "aten::add") if noise_add else ():
                tb.op(name, at, 30)
                at += 35
        for _ in range(tensors):
            for name in per_tensor:
                tb.op(name, at, op_us)
                at += op_us + 5
        f0 = t + bookkeeping_us
        tb.op("aten::linear", f0, 300)
        tb.op("aten::addmm", f0 + 20, 250)
        tb.op("aten::relu", f0 + 320, 30)
        if backward:
            tb.op("autograd::engine::evaluate_function: ReluBackward0", f0 + 400, 100)
            tb.op("autograd::engine::evaluate_function: AddmmBackward0", f0 + 520, 300)
        tb.op("Optimizer.step#SGD.step", f0 + 850, 140, cat="user_annotation")
        if cc is not None:
            tb.kernel("gemm", f0 + 40, 200, launch_ts=f0 + 30)
        t += dur
    return tb.to_dict()


def test_the_forward_starts_at_its_first_operator_the_backward_undoes():
    r = analyze(_training(2000))
    med = r.metrics.phases.median_ms
    assert med.forward == pytest.approx(0.4, abs=0.01)  # linear (addmm inside) → the backward's start
    # the loop's own code before the forward less zero_grad (2 ms − 4 µs), and the model's gaps:
    # backward → optimizer (30 µs) and optimizer → step end (10 µs)
    assert med.other == pytest.approx(2.0 - 0.004 + 0.030 + 0.010, abs=0.001)
    f = r.finding("loop-host-work")
    # the loop's code only (2 ms less zero_grad's 4 µs), not the gaps between backward, optimizer and step end
    assert f is not None and f.evidence.numbers["loop_work_step_ms"] == pytest.approx(2.0 - 0.004, abs=0.001)


def test_without_a_backward_the_forward_starts_at_the_first_operator():
    med = analyze(_training(2000, backward=False)).metrics.phases.median_ms
    assert med.forward >= 2.0  # from the argmax: with no backward, nothing tells the loop's code apart
    assert analyze(_training(2000, backward=False)).finding("loop-host-work") is None


def test_thresholds():
    assert analyze(_training(MIN_STEP_MS * 1000 * 0.8)).finding("loop-host-work") is None  # under 0.5 ms a step
    assert analyze(_training(MIN_STEP_MS * 1000 * 1.2)).finding("loop-host-work") is not None
    assert analyze(_training(2000, cc=(8, 0))).finding("loop-host-work") is None  # a GPU trace: not this rule's


def test_a_python_loop_over_tensors_gets_the_foreach_fix():
    """An EMA of 26 parameter tensors (mul_ and add_ on each, in Python) between the steps."""
    f = analyze(_training(2000, per_tensor=("aten::mul_", "aten::add_"), tensors=26)).finding("loop-host-work")
    assert f is not None and f.evidence.numbers["in_place_calls_per_step"] == 52
    assert "aten::mul_ ×26, aten::add_ ×26" in f.evidence.summary and "a Python loop over tensors" in f.why
    assert "torch._foreach_lerp_" in f.fixes[0].code and f.fixes[1].diagnostic and len(f.fixes) == 2
    # the fix follows what the loop does: zeroing each gradient, clipping each weight
    f = analyze(_training(2000, per_tensor=("aten::zero_",), tensors=26)).finding("loop-host-work")
    assert "optimizer.zero_grad()" in f.fixes[0].code and "set_to_none" in f.fixes[0].code
    f = analyze(_training(2000, per_tensor=("aten::clamp_",), tensors=26)).finding("loop-host-work")
    assert "torch._foreach_clamp_min_(params, -c)" in f.fixes[0].code
    # a few in-place calls a step (a running sum), or many tiny ones beside a longer operator: bookkeeping's fix
    for kwargs in ({"tensors": 7}, {"tensors": 26, "op_us": 0.1}):
        f = analyze(_training(2000, per_tensor=("aten::mul_", "aten::add_"), **kwargs)).finding("loop-host-work")
        assert "correct = correct +" in f.fixes[0].code and "Python loop over tensors" not in f.why


def test_batches_built_from_python_lists_get_the_convert_once_fix():
    f = analyze(_training(2000, from_python_us=400)).finding("loop-host-work")
    assert f is not None and f.evidence.numbers["from_python_data_frac"] == pytest.approx(2 * 404 / 1996, abs=1e-3)
    assert "2 tensors a step were built from Python data" in f.evidence.summary
    assert "torch.tensor(data" in f.fixes[0].code and "randperm" in f.fixes[0].code and f.fixes[1].diagnostic
    assert "from Python data each step" in f.why
    # fills under a quarter of the loop's code: the bookkeeping fix
    f = analyze(_training(2000, from_python_us=200)).finding("loop-host-work")
    assert "correct = correct +" in f.fixes[0].code and "Python data" not in f.evidence.summary


def test_a_loop_drawing_random_inputs_gets_the_pool_fix():
    """torch.randn for the inputs each step: not bookkeeping. The pool fix, its time as the gain;
    under half of the loop's code in the generator: the bookkeeping fix and the whole time."""
    f = analyze(_training(2000, random_us=1500)).finding("loop-host-work")
    n = f.evidence.numbers
    assert n["random_ops_frac"] == pytest.approx(1500 / 1996, abs=1e-3)
    assert f.est_gain == pytest.approx(n["random_ops_frac"] * n["loop_work_frac"], abs=2e-3)
    assert f.est_gain < n["loop_work_frac"]
    assert "pool" in f.fixes[0].code and "randn_like" in f.fixes[0].code and "diffusion" in f.why
    assert "Random-number operators took" in f.evidence.summary and f.fixes[1].diagnostic
    f = analyze(_training(2000, random_us=800)).finding("loop-host-work")
    assert "correct = correct +" in f.fixes[0].code and f.est_gain == f.evidence.numbers["loop_work_frac"]


def test_random_draws_combined_with_the_batch_are_an_augmentation_not_synthetic_inputs():
    """A SimCLR-style loop augments its batch in torch operators: draws (over half the loop's code)
    and the operators that apply them (a flip, a roll: over a quarter). A pool of draws would
    freeze the augmentation: the preparing fix (the DataLoader's workers), the whole time."""
    f = analyze(_training(2000, random_us=1100, prepare=("aten::flip", "aten::roll"))).finding("loop-host-work")
    n = f.evidence.numbers
    assert n["random_ops_frac"] > 0.5 and "pool" not in f.fixes[0].code and "collate_fn=collate_and_augment" in f.fixes[0].code
    assert f.est_gain == n["loop_work_frac"] and "augments its batches" in f.why


def test_noise_added_to_the_batch_is_no_synthetic_input():
    """A denoising autoencoder's x + 0.3 * randn_like(x): the draw takes most of the time, the
    scaling and the addition little, but they are two calls for its one: noise applied to real
    data, which a pool of draws would replace: no pool fix."""
    f = analyze(_training(2000, random_us=1500, noise_add=True)).finding("loop-host-work")
    assert f.evidence.numbers["random_ops_frac"] > 0.5 and "pool" not in f.fixes[0].code
    assert "augments its batches" in f.why


@pytest.mark.parametrize(("busy", "gain"), [(190.0, False), (60.0, True)])
def test_the_augmentation_fix_gains_only_with_a_core_free_for_the_workers(busy, gain):
    """CPU samples with the 2 usable cores busy (1.9 in use): the workers would take the step's
    cores, no gain; with 0.6 in use, the share."""
    d = _training(2000, random_us=1100, prepare=("aten::flip", "aten::roll"))
    times = [2_000_000 * (j + 1) for j in range(8)]
    d["gpumagic"] = {
        "format": 1, "label": "", "notes": [], "capture": {}, "versions": {}, "clock": {"anchor_epoch_ns": None},
        "machine": {"cpu_count": 2, "cpu_affinity": [0, 1], "cpu_quota_cores": None,
                    "usable_cores": 2.0, "usable_cores_source": "affinity"},
        "samples": {"cpu": {"t_epoch_ns": times, "total": [busy / 2] * 8, "per_core": [[busy / 2, busy / 2]] * 8,
                            "main": [busy] * 8, "main_thread": [90.0] * 8, "workers": [0.0] * 8,
                            "worker_count": [0] * 8}},
    }
    r = analyze(d)
    assert r.metrics.host.cpu_busy_cores == pytest.approx(busy / 100, abs=0.05)
    f = r.finding("loop-host-work")
    assert "collate_and_augment" in f.fixes[0].code
    if gain:
        assert f.est_gain == f.evidence.numbers["loop_work_frac"]
    else:
        assert f.est_gain == 0.0 and "no core is free" in f.gain_method and "cores busy" in f.why


def test_the_augmentation_fix_augments_each_batch_in_the_loader():
    """The collate_fn gives the batches the plain loader gives, augmented (num_workers=0 here: the
    same function runs in a worker)."""
    import torch

    from gpumagic.analysis.rules.loopwork import AUGMENT_WORKERS_CODE

    dataset = torch.utils.data.TensorDataset(torch.arange(24.0).reshape(12, 2), torch.arange(12))
    code = AUGMENT_WORKERS_CODE.replace("num_workers=2, persistent_workers=True", "num_workers=0")
    code = code.replace("shuffle=True", "shuffle=False")
    ns = {"torch": torch, "dataset": dataset, "batch_size": 4, "augment": lambda xb: xb.flip(-1)}
    exec(compile(code, "<fix>", "exec"), ns)
    got = list(ns["loader"])
    assert len(got) == 3 and torch.equal(got[0][0], dataset.tensors[0][:4].flip(-1))
    assert torch.equal(got[2][1], dataset.tensors[1][8:])


def test_a_loop_preparing_its_batches_gets_the_prepare_once_fix():
    """Operators, not Python, most of the loop's code, and not bookkeeping's reductions: the batch
    is cast and normalized each step. Reductions instead (a confusion matrix on tensors): the
    bookkeeping fix."""
    f = analyze(_training(2000, prepare=("aten::to", "aten::div", "aten::sub", "aten::div"))).finding("loop-host-work")
    assert f.evidence.numbers["no_operator_frac"] < 0.5 and f.evidence.numbers["bookkeeping_ops_frac"] < 0.01
    assert "raw_inputs.float()" in f.fixes[0].code and "num_workers" in f.fixes[0].code and "augmentation" in f.why
    assert f.est_gain == f.evidence.numbers["loop_work_frac"]
    f = analyze(_training(2000, prepare=("aten::argmax", "aten::eq", "aten::sum", "aten::to"))).finding("loop-host-work")
    assert f.evidence.numbers["bookkeeping_ops_frac"] > 0.5 and "correct = correct +" in f.fixes[0].code


def test_a_recorded_loop_preparing_its_batches():
    """benchmarks/loop_work_fixes.py --record: 2,048 uint8 images cast and normalized each step
    for an MLP (784 → 32 → 10); unprofiled, the dataset normalized once saved 0.386 of the step."""
    f = analyze(PREPARE).finding("loop-host-work")
    assert "aten::div" in f.evidence.summary and f.evidence.numbers["no_operator_frac"] < 0.5
    assert "all_inputs = (raw_inputs.float()" in f.fixes[0].code


def test_a_recorded_loop_drawing_its_inputs():
    """benchmarks/loop_work_fixes.py --record: an MLP step on 512 rows drawn with torch.randn each
    step; unprofiled, a pool of 8 batches drawn once saved 0.154 of the step."""
    f = analyze(RANDOM_INPUTS).finding("loop-host-work")
    assert f.evidence.numbers["random_ops_frac"] > 0.8 and "aten::randn" in f.evidence.summary
    assert 0.1 < f.est_gain < f.evidence.numbers["loop_work_frac"] and "pool drawn once" in f.gain_method
    assert "pool = [" in f.fixes[0].code


def test_a_recorded_loop_converting_lists_each_step():
    """torch.tensor of a 256 x 64 list each step takes milliseconds, the model a fraction of one
    (tests/data/cpu_loop_from_lists.json.gz, ``benchmarks/loop_work_fixes.py --record``). It was
    recorded live in this test once, and beside busy neighbours the shares moved (the model's
    operators slowed more than the Python around them) and the rule stayed silent: a recorded
    bundle keeps the test from timing."""
    f = analyze(FROM_LISTS).finding("loop-host-work")
    assert f is not None
    assert "2 tensors a step were built from Python data" in f.evidence.summary
    assert f.evidence.numbers["from_python_data_frac"] >= 0.25 and "torch.tensor(data" in f.fixes[0].code


def test_the_convert_once_fix_visits_every_sample_once_an_epoch():
    import torch

    from gpumagic.analysis.rules.loopwork import FROM_PYTHON_CODE

    data = [[float(i), float(-i)] for i in range(10)]
    ns = {"torch": torch, "data": data, "labels": list(range(10)), "epochs": 2, "batch_size": 3}
    seen = []
    exec(FROM_PYTHON_CODE + "        seen.append((x.clone(), y.clone()))\n", {**ns, "seen": seen})
    assert len(seen) == 2 * 4  # 4 batches an epoch (3, 3, 3, 1)
    for epoch in (seen[:4], seen[4:]):
        xs, ys = torch.cat([b[0] for b in epoch]), torch.cat([b[1] for b in epoch])
        assert sorted(ys.tolist()) == list(range(10))
        assert all(x.tolist() == data[int(y)] for x, y in zip(xs, ys, strict=True))  # rows stay with their labels


def _sampled(main_demand: float | None, main_thread: float | None = None, every_ms: float = 3.0, **kw) -> dict:
    """:func:`_training` (2 ms of the loop's own code, then 1 ms of model, six steps) with CPU
    samples every ``every_ms`` from the start: the main thread's demand (schedstat) or run time,
    percent of a core; the process's ``main`` always busy (its other threads)."""
    d = _training(2000, **kw)
    n = int(18 // every_ms) + 1
    cpu = {"t_epoch_ns": [int(i * every_ms * 1e6) for i in range(n)], "main": [150.0] * n}
    if main_demand is not None:
        cpu["main_demand"] = [main_demand] * n
    if main_thread is not None:
        cpu["main_thread"] = [main_thread] * n
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "machine": {}, "samples": {"cpu": cpu}}
    return d


def test_a_loop_that_sleeps_is_told_from_one_that_computes():
    """The model's operators hold 0.9 ms of each 3 ms step: a main thread wanting 35 % of a core
    slept through the loop's own code; one wanting a whole core computed there."""
    f = analyze(_sampled(35.0)).finding("loop-host-work")
    n = f.evidence.numbers
    assert n["main_thread_core_use"] < MAX_WAITING_USE and "it mostly waited" in f.evidence.summary
    assert "mostly slept" in f.why and "(Python)" not in f.evidence.summary
    assert "ThreadPoolExecutor" in f.fixes[1].code and f.fixes[0].diagnostic  # %%prun first: find the wait
    f = analyze(_sampled(100.0)).finding("loop-host-work")
    assert f.evidence.numbers["main_thread_core_use"] == 1.0 and "correct = correct +" in f.fixes[0].code
    assert "mostly waited" not in f.evidence.summary and "(Python)" in f.evidence.summary
    # without schedstat, the thread's run time; never the whole process's ("main": other threads too)
    assert analyze(_sampled(None, main_thread=35.0)).finding("loop-host-work").evidence.numbers[
        "main_thread_core_use"] < MAX_WAITING_USE
    assert "main_thread_core_use" not in analyze(_sampled(None)).finding("loop-host-work").evidence.numbers


def test_waits_between_the_operators_of_a_tensor_loop_keep_the_loops_fix():
    """The loop's own code mostly in-place operators (an EMA, 52 calls of 30 µs a step): however
    idle the thread between them, the fix is the operators'."""
    f = analyze(_sampled(35.0, per_tensor=("aten::mul_", "aten::add_"), tensors=26, op_us=30)).finding(
        "loop-host-work")
    assert f.evidence.numbers["no_operator_frac"] < 0.5 and "torch._foreach_lerp_" in f.fixes[0].code
    assert "mostly slept" not in f.why


def test_samples_reaching_past_the_window_are_not_read():
    """A sample holding the profiler's export after the window would read as the loop's own
    Python: only samples inside the window count, and fewer than one period's worth say nothing."""
    d = _sampled(35.0, every_ms=6.0)  # samples at 0, 6, 12, 18 ms; then one at 24 ms, past the 18 ms window
    cpu = d["gpumagic"]["samples"]["cpu"]
    cpu["t_epoch_ns"].append(24_000_000)
    cpu["main"].append(150.0)
    cpu["main_demand"] = [35.0] * 4 + [100.0]  # the export after the window: a busy thread
    n = analyze(d).finding("loop-host-work").evidence.numbers
    assert n["main_thread_core_use"] < MAX_WAITING_USE  # from the samples inside alone
    cpu["t_epoch_ns"], cpu["main"], cpu["main_demand"] = [6_000_000, 24_000_000], [150.0] * 2, [35.0] * 2
    assert "main_thread_core_use" not in analyze(d).finding("loop-host-work").evidence.numbers


def test_a_recorded_loop_that_sleeps_between_steps():
    """time.sleep after each step (as a blocking upload would): the samples show the main thread
    idle there. Recorded live: 40 steps of a tiny model, 20 ms asleep each."""
    import time

    import torch

    import gpumagic

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with gpumagic.profile(steps=40, skip=1, display=False) as run:
        for _ in range(42):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)
    f = run.report.finding("loop-host-work")
    assert f is not None and f.evidence.numbers["main_thread_core_use"] < 0.3
    assert any("ThreadPoolExecutor" in fx.code for fx in f.fixes)


def test_the_foreach_fix_computes_the_loops_moving_average():
    import copy

    import torch

    from gpumagic.analysis.rules.loopwork import FOREACH_CODE

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    ema_model, by_hand = copy.deepcopy(model), copy.deepcopy(model)
    ns = {"torch": torch, "model": model, "ema_model": ema_model, "decay": 0.9}
    exec(FOREACH_CODE.split("# in the loop")[0], ns)
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            for e, p in zip(by_hand.parameters(), model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)
        exec(FOREACH_CODE.split("# in the loop")[1].split("\n", 1)[1], ns)
    for e, h in zip(ema_model.parameters(), by_hand.parameters(), strict=True):
        torch.testing.assert_close(e, h)


def test_the_tensor_fix_counts_what_the_python_loop_counts():
    import torch

    from gpumagic.analysis.rules.loopwork import TENSOR_METRICS_CODE

    torch.manual_seed(0)
    ns = {"torch": torch}
    code = TENSOR_METRICS_CODE.split("# in the loop")[0]
    exec(code, ns)
    by_hand = 0
    for step in range(1, 201):
        logits, targets = torch.randn(8, 5), torch.randint(0, 5, (8,))
        by_hand += sum(int(a == b) for a, b in zip(logits.argmax(1).tolist(), targets.tolist(), strict=True))
        ns.update(logits=logits, targets=targets, step=step)
        exec("\n".join(TENSOR_METRICS_CODE.splitlines()[2:]), ns)
    assert int(ns["correct"]) == by_hand and ns["seen"] == 1600


def test_the_prun_diagnostic_runs_in_ipython():
    from ipyshell import ipython_shell
    from IPython.utils.capture import capture_output

    from gpumagic.analysis.rules.loopwork import PRUN_CODE

    with ipython_shell("gpumagic") as ip, capture_output() as out:
        result = ip.run_cell(PRUN_CODE.strip() + "\nsum(i * i for i in range(1000))")
    assert result.success, result.error_in_exec
    assert "tottime" in out.stdout  # the profile's table, slowest by own time


def test_with_stacks_the_loops_own_python_function_is_named():
    """with_stack: the cell's frame encloses every step (it must not start the forward), and the
    function that did the bookkeeping is named by its own time, less what it called."""
    d = _training(2000)
    steps = [e for e in d["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    end = steps[-1]["ts"] + steps[-1]["dur"]
    d["traceEvents"].append({"ph": "X", "cat": "python_function", "name": "<ipython-input-3>(1): <module>",
                             "ts": 0, "dur": end, "pid": 100, "tid": 100})
    for s in steps:
        d["traceEvents"].append({"ph": "X", "cat": "python_function", "name": "train.py(40): count_correct",
                                 "ts": s["ts"] + 20, "dur": 1900, "pid": 100, "tid": 100})
        d["traceEvents"].append({"ph": "X", "cat": "python_function",
                                 "name": "<built-in method tolist of Tensor object at 0x7f00deadbeef>",
                                 "ts": s["ts"] + 30, "dur": 300, "pid": 100, "tid": 100})
    r = analyze(d)
    assert r.metrics.phases.median_ms.forward == pytest.approx(0.4, abs=0.01)
    summary = r.finding("loop-host-work").evidence.summary
    assert "train.py(40): count_correct 9.60 ms" in summary  # 6 × (1.9 − 0.3) ms of its own
    assert "<built-in method tolist of Tensor object> 1.80 ms" in summary  # the address left out
    # the cell's frame: its own time in the loop's code is 20 µs a step, under the 5 % it takes to be named
    assert "<module>" not in summary
