"""``frequent-evaluation``: evaluation loops in most steps, from the step timer's every_step block.
On built blocks that vary one condition at a time, the accounting against a direct sum, a live
loop that evaluates after every step, and the fixes run."""

from __future__ import annotations

import pytest
from everystep_blocks import block, with_every_step
from tracebuilder import TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.everystep import evaluations, read

ID = "frequent-evaluation"


def evaluating(steps: list[float], eval_ms: float, every: int = 1, first: int = 1, frozen: bool = False) -> dict:
    """A bundle whose every_step block has these step durations and an evaluation loop of
    ``eval_ms`` at the start of every ``every``-th step from ``first`` on (after the previous
    step's optimizer step, as a loop that evaluates after training does); ``frozen``: the eval-mode
    span lasts through an optimizer step (a frozen submodule, which is training)."""
    b = block(steps)
    b["events"] = [{"kind": "eval", "start_ms": b["start_ms"][i] + 0.001,
                    "dur_ms": eval_ms + (steps[i] if frozen else 0.0), "detail": ""}
                   for i in range(first, len(steps), every)]
    return with_every_step(b)


def test_an_evaluation_after_every_step_fires_with_its_share_and_an_interval():
    r = analyze(evaluating([10.0] * 30, 5.0))
    f = r.finding(ID)
    assert f is not None and f.title.startswith("An evaluation loop runs every step and takes 50.0 %")
    n = f.evidence.numbers
    assert n["evaluations"] == 29 and n["steps"] == 29 and n["evaluation_frac"] == pytest.approx(0.5, abs=1e-3)
    # 5 ms an evaluation against 5 ms of training: under 5 % of the time needs 19 steps, written 20
    assert n["suggested_every_steps"] == 20 and "eval_every = 20" in f.fixes[0].code
    after = 5.0 / (20 * 5.0 + 5.0)
    assert f.est_gain == pytest.approx(0.5 - after, abs=1e-3) and f.gain_method.startswith("estimate")
    assert 'eval_strategy="steps", eval_steps=20' in f.fixes[-1].code
    assert r.metrics.steps.evaluation_count == 29 and r.metrics.steps.evaluation_frac == pytest.approx(0.5, abs=1e-3)


def test_an_interval_beyond_the_cells_steps_says_so():
    """Thirty steps with an evaluation each: every 20 steps fits the cell; an evaluation four
    times as long needs every 100, more steps than the cell ran."""
    assert "only at the end" not in analyze(evaluating([10.0] * 30, 5.0)).finding(ID).why
    f = analyze(evaluating([10.0] * 30, 8.0)).finding(ID)
    assert f.evidence.numbers["suggested_every_steps"] > 30 and "This cell ran 30 optimizer steps" in f.why


def test_evaluations_every_few_steps_are_counted_as_such():
    f = analyze(evaluating([10.0] * 30, 4.0, every=3)).finding(ID)
    assert f is not None and "every 3 steps" in f.title


@pytest.mark.parametrize(("why", "bundle"), [
    ("a small share", evaluating([10.0] * 30, 0.5)),
    ("one evaluation", evaluating([10.0] * 30, 6.0, every=100)),
    ("a frozen submodule in eval mode: training", evaluating([10.0] * 30, 5.0, frozen=True)),
    ("no evaluation", with_every_step(block([10.0] * 30))),
])
def test_it_stays_silent_when_a_condition_fails(why, bundle):
    assert ID not in analyze(bundle).finding_ids, why


def _rollouts(draws: bool) -> dict:
    """Thirty steps of 10 ms, each starting with 5 ms in eval mode; the three recorded steps of the
    trace hold that time too, with ``draws``: three actions drawn there (``aten::multinomial``)."""
    b = block([10.0] * 30, recorded=(1, 2, 3), profiled=4)
    b["events"] = [{"kind": "eval", "start_ms": b["start_ms"][i] + 0.001, "dur_ms": 5.0, "detail": ""}
                   for i in range(1, 30)]
    tb = TraceBuilder(cc=None)
    for k in (1, 2, 3):
        t = (b["start_ms"][k] - b["start_ms"][1]) * 1000
        tb.step(k, t, 10_000)
        for j in range(3):
            tb.op("aten::linear", t + 100 + j * 1_500, 1_000)
            if draws:
                tb.op("aten::multinomial", t + 1_150 + j * 1_500, 30)
        tb.op("aten::addmm", t + 5_200, 4_000)
    d = tb.to_dict()
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "capture": {}, "machine": {}, "versions": {},
                     "clock": {"anchor_epoch_ns": None}, "samples": {}, "every_step": b}
    return d


def test_a_rollout_that_draws_actions_in_eval_mode_is_no_evaluation():
    """A reinforcement-learning loop that acts with its policy in eval mode between updates
    (stable-baselines3's set_training_mode(False) while collecting rollouts) draws actions with
    torch.multinomial there: the rollout is the updates' data, not an evaluation to run less often,
    and the loop's own work (steady, no evaluation phase)."""
    r = analyze(_rollouts(draws=False))
    assert "evaluation" in {s.kind for s in r.metrics.window.segments} and r.finding(ID) is not None
    assert sum(p.evaluation for p in r.metrics.phases.per_step) > 0
    rollout = analyze(_rollouts(draws=True))
    assert rollout.finding(ID) is None
    # the rollout is the loop's own work: steady, and no evaluation phase
    assert {s.kind for s in rollout.metrics.window.segments} == {"steady"}
    assert all(p.evaluation == 0.0 for p in rollout.metrics.phases.per_step)


def test_long_evaluations_every_few_steps_are_this_not_step_outliers():
    """An evaluation of 240 ms every 10 steps of 10 ms makes its steps outliers, and takes 66 % of
    the time: this rule counts them (an evaluation explains each), and step-outliers leaves them
    to it; an outlier no evaluation explains (a busy machine) stays step-outliers' and out of
    this count."""
    steps = [10.0] * 40
    for i in (10, 20, 30):
        steps[i] = 250.0
    b = block(steps)
    b["events"] = [{"kind": "eval", "start_ms": b["start_ms"][i] + 0.001, "dur_ms": 240.0, "detail": ""} for i in (10, 20, 30)]
    r = analyze(with_every_step(b))
    f = r.finding(ID)
    assert f.evidence.numbers["evaluations"] == 3 and f.evidence.numbers["suggested_every_steps"] == 500
    assert f.evidence.numbers["evaluation_frac"] == pytest.approx(720 / (36 * 10 + 3 * 250), abs=0.01)
    assert r.finding("step-outliers") is None
    steps[25] = 250.0  # and a step nothing explains
    b = block(steps)
    b["events"] = [{"kind": "eval", "start_ms": b["start_ms"][i] + 0.001, "dur_ms": 240.0, "detail": ""} for i in (10, 20, 30)]
    r = analyze(with_every_step(b))
    assert r.finding(ID).evidence.numbers["steps"] == 38
    assert [o.index for o in r.metrics.steps.outliers if o.index == 25] and r.finding("step-outliers") is not None
    assert "25" in r.finding("step-outliers").evidence.summary and "Step 10" not in r.finding("step-outliers").evidence.summary


def test_the_accounting_matches_a_direct_sum():
    d = evaluating([10.0, 12.0, 9.0, 11.0, 10.0, 14.0], 3.0, every=2)
    b = read(d["gpumagic"]["every_step"], [])
    e = evaluations(b)
    assert e["count"] == 3 and e["ms"] == pytest.approx(9.0, abs=0.01) and e["steps"] == 5
    assert e["steps_ms"] == pytest.approx(12.0 + 9.0 + 11.0 + 10.0 + 14.0) and e["steps_with"] == 3


def test_a_live_loop_that_evaluates_after_every_step():
    """A CPU model trained for 12 steps, each followed by an evaluation on a validation batch 16
    times the training batch: the finding reads the evaluations the step timer saw."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xv = torch.randn(1024, 64)
    with gpumagic.profile(steps=3, nvml=False, display=False) as run:
        for _ in range(12):
            model.train()
            loss = model(torch.randn(64, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                for _ in range(4):
                    model(xv).argmax(1)
    steps = run.report.metrics.steps
    assert steps.evaluation_count >= 10  # after each step but the first (the warm-up) and the last
    f = run.report.finding(ID)
    if steps.evaluation_frac >= 0.10 and not steps.outliers:  # a busy machine's outliers are left out
        assert f is not None and f.evidence.numbers["evaluations"] == steps.evaluation_count
