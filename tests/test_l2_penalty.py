"""``l2-penalty-in-loss``: a loss that adds ``lam * sum(p.pow(2).sum() for p in params)`` by hand,
where the optimizer's ``weight_decay = 2 * lam`` gives the same update (``rules.l2penalty``)."""

from __future__ import annotations

import os

import pytest
import torch
from tracebuilder import DATA

import gpumagic
from gpumagic.analysis.rules import l2penalty
from gpumagic.analysis.rules.l2penalty import ADAM_TWIN_CODE, ADAMW_DECAY_CODE, COUPLED, _coupled_code

BUNDLE = os.path.join(DATA, "cpu_l2_penalty.json.gz")
LAM = 1e-3


def _mlp(dtype=torch.float32, layers: int = 6):
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(32, 4)).to(dtype)


def _steps(opt_cls, penalty: bool, steps: int = 8, **kwargs):
    """Parameters after ``steps`` float64 updates, the penalty in the loss or as weight_decay = 2 * LAM."""
    model = _mlp(torch.float64)
    opt = opt_cls(model.parameters(), **kwargs, **({} if penalty else {"weight_decay": 2 * LAM}))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=gen, dtype=torch.float64), torch.randint(0, 4, (16,), generator=gen)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if penalty:
            loss = loss + LAM * sum(p.pow(2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


LR = {"SGD": 1e-2, "Adagrad": 1e-2, "Adadelta": 1.0, "ASGD": 1e-2}


@pytest.mark.parametrize("name", sorted(COUPLED))
def test_weight_decay_of_twice_lam_is_the_penalty_exactly(name):
    """The fix's claim, for every optimizer it names: the same parameters after eight steps."""
    cls = getattr(torch.optim, name)
    kwargs = {"lr": LR.get(name, 1e-3), **({"momentum": 0.9} if name == "SGD" else {})}
    for a, b in zip(_steps(cls, True, **kwargs), _steps(cls, False, **kwargs), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_adamw_weight_decay_is_not_the_penalty():
    """Why AdamW gets another fix: its decoupled decay gives other parameters."""
    diff = max(float((a - b).abs().max()) for a, b in zip(_steps(torch.optim.AdamW, True, lr=1e-2),
                                                          _steps(torch.optim.AdamW, False, lr=1e-2), strict=True))
    assert diff > 1e-6


def test_adam_with_twice_lam_is_adamw_without_decay_and_with_the_penalty():
    """The first AdamW fix's claim."""
    twin = _steps(torch.optim.Adam, False, lr=1e-2)
    adamw = _steps(torch.optim.AdamW, True, lr=1e-2, weight_decay=0.0)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(twin, adamw, strict=True))


def test_the_recorded_penalty_is_found_with_the_fix_that_runs():
    r = gpumagic.analyze(BUNDLE)
    f = r.finding("l2-penalty-in-loss")
    assert f is not None and f.evidence.numbers["optimizer"] == "SGD"
    assert f.evidence.numbers["penalty_terms_per_update"] == f.evidence.numbers["parameter_tensors_per_update"] == 14
    assert 0.05 <= f.est_gain < 1 and f.gain_method.startswith("estimate")
    # the fix's code runs as written and sets weight_decay to twice the penalty's coefficient
    model, lam, lr = _mlp(), 0.01, 0.1
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    ns = {"torch": torch, "model": model, "lam": lam, "lr": lr, "x": x, "y": y,
          "loss_fn": torch.nn.functional.cross_entropy}
    exec(compile(f.fixes[0].code, "<fix>", "exec"), ns)
    assert isinstance(ns["optimizer"], torch.optim.SGD) and ns["optimizer"].param_groups[0]["weight_decay"] == 2 * lam
    assert ns["loss"].ndim == 0


@pytest.fixture
def any_share(monkeypatch):
    """The live loops below test what the rule reads from the operators, not the share threshold,
    which a busy machine moves (the recorded bundle above holds it): no threshold for them."""
    monkeypatch.setattr(l2penalty, "MIN_FRAC", 0.0)


def _profiled(opt_cls, penalty: str, layers: int = 6, **kwargs):
    model = _mlp(layers=layers)
    opt = opt_cls(model.parameters(), lr=1e-3, **kwargs)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    h = torch.randn(16, 32, requires_grad=True)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if penalty == "l2":
            loss = loss + LAM * sum(p.pow(2).sum() for p in model.parameters())
        elif penalty == "norms":
            loss = loss + LAM * sum(p.norm() ** 2 for p in model.parameters())
        elif penalty == "squares":
            loss = loss + LAM * sum(torch.square(p).sum() for p in model.parameters())
        elif penalty == "two squares":  # a loss that squares and sums two activations, not the parameters
            loss = loss + (model[0](h).pow(2).sum() + model[2](h).pow(2).sum()) * LAM
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    with gpumagic.profile(steps=6, display=False, nvml=False) as run:
        for _ in range(8):
            step()
    return run.report


def test_a_loop_with_weight_decay_or_a_few_squares_is_silent(any_share):
    assert "l2-penalty-in-loss" not in _profiled(torch.optim.SGD, "none", weight_decay=2 * LAM).finding_ids
    assert "l2-penalty-in-loss" not in _profiled(torch.optim.SGD, "two squares").finding_ids


@pytest.mark.parametrize("form", ["norms", "squares"])
def test_the_penalty_written_as_norms_squared_or_squares_is_found(form, any_share):
    f = _profiled(torch.optim.SGD, form).finding("l2-penalty-in-loss")
    assert f is not None
    n = f.evidence.numbers   # a term for each of the 14 tensors (per update: the window may cut one short)
    assert n["penalty_terms_per_update"] == n["parameter_tensors_per_update"] >= 10


def test_an_optimizer_without_weight_decay_is_silent(any_share):
    assert "l2-penalty-in-loss" not in _profiled(torch.optim.Rprop, "l2").finding_ids


def test_adamw_gets_the_coupled_twin_and_its_own_decay(any_share):
    f = _profiled(torch.optim.AdamW, "l2").finding("l2-penalty-in-loss")
    assert f is not None and [x.code for x in f.fixes] == [ADAM_TWIN_CODE.strip("\n"), ADAMW_DECAY_CODE.strip("\n")]
    assert "decoupled" in f.why
    for fix, cls in zip(f.fixes, (torch.optim.Adam, torch.optim.AdamW), strict=True):  # each runs as written
        ns = {"torch": torch, "model": _mlp(), "lam": 0.01, "wd": 0.05, "lr": 1e-3, "x": torch.randn(4, 32),
              "y": torch.randint(0, 4, (4,)), "loss_fn": torch.nn.functional.cross_entropy}
        exec(compile(fix.code, "<fix>", "exec"), ns)
        assert type(ns["optimizer"]) is cls
        assert ns["optimizer"].param_groups[0]["weight_decay"] == (0.02 if cls is torch.optim.Adam else 0.05)


def test_the_param_group_comment_lines_up_for_any_optimizer():
    for name in ("SGD", "RMSprop", "Adadelta"):
        lines = _coupled_code(name).splitlines()
        first, second = lines[-2], lines[-1]
        assert first.index("{") == second.index("{")
