"""The checklist's order: mistakes in what the code computes (``report.model.MISTAKES``) lead, then
warm-up that fills the window, then the estimated gain. A loop that builds a new Adam every step
read "fuse the optimizer" first (30 % of the step) and "a new optimizer each step" last: the faster
step of a run whose optimizer forgets its state is no gain."""

from __future__ import annotations

from dataclasses import replace

from test_optimizer_state_reset import _loop

from gpumagic import analyze
from gpumagic.analysis.gains import GAIN_KINDS
from gpumagic.analysis.rules import FINDING_IDS
from gpumagic.analysis.rules.warmup import lead_with_warmup
from gpumagic.render._format import checklist_order
from gpumagic.render.text import render_text
from gpumagic.report.model import MISTAKES, sort_findings


def test_every_mistake_is_a_rule_that_claims_no_speed_gain():
    assert set(FINDING_IDS) >= MISTAKES
    assert {GAIN_KINDS[i] for i in MISTAKES} == {"none"}


def test_a_new_optimizer_each_step_leads_the_faster_optimizer():
    r = analyze(_loop())
    assert r.finding_ids[:2] == ["optimizer-state-reset", "unfused-optimizer"]
    assert r.finding("unfused-optimizer").est_gain > r.finding("optimizer-state-reset").est_gain == 0
    text = render_text(r)
    assert "CHECKLIST (mistakes first, then biggest estimated gain)" in text
    assert "Top finding: [MED] Every Adam update starts from empty optimizer state" in text


def test_the_order_of_mistakes_warm_up_and_gains():
    r = analyze(_loop())
    reset, fused = r.finding("optimizer-state-reset"), r.finding("unfused-optimizer")
    warmup = replace(fused, id="warmup-in-window", est_gain=0.0, evidence=replace(fused.evidence, numbers={"warmup_frac": 0.8}))
    bigger = replace(fused, id="cpu-op-overhead", est_gain=0.6)
    ordered = lead_with_warmup(sort_findings([fused, warmup, bigger, reset]))
    assert [f.id for f in ordered] == ["optimizer-state-reset", "warmup-in-window", "cpu-op-overhead", "unfused-optimizer"]
    assert checklist_order(ordered) == "mistakes first, then warm-up, then biggest gain"
    assert checklist_order(ordered[1:]) == "warm-up first, then biggest gain"
    assert checklist_order(ordered[2:]) == "biggest gain first"
    assert checklist_order([reset]) == "biggest gain first"  # nothing to order
    assert checklist_order([reset, fused]) == "mistakes first, then biggest gain"
    # a kept optimizer: the same loop without the mistake goes by gain
    assert analyze(_loop(fresh=False)).finding_ids[0] == "unfused-optimizer"
