"""``inference-train-mode`` in a training trace: forward passes run under ``torch.no_grad()`` or
``torch.inference_mode()`` (their ``aten::dropout`` records no sequence number) while the model
was in training mode (the dropout call runs operators: it drew a mask): a validation without
``model.eval()``, or a frozen part of the model run under no_grad after ``model.train()``.
Recorded here with torch on the CPU."""

from __future__ import annotations

import json
import warnings

import pytest

from gpumagic import analyze

ID = "inference-train-mode"
STEPS = 5


def _model():
    import torch

    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.2))
    head = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4))
    return backbone, head, torch.nn.Sequential(backbone, head)


def _step(mode: str, backbone, head, model, opt, x, y) -> None:
    """One training step, then (per ``mode``) a validation."""
    import torch
    from torch.utils.checkpoint import checkpoint

    model.train()
    if mode == "frozen part in eval mode":
        backbone.eval()
    opt.zero_grad()
    if mode.startswith("frozen part"):
        with torch.no_grad():
            features = backbone(x)
        out = head(features)
    elif mode.endswith("checkpoint"):
        out = head(checkpoint(backbone, x, use_reentrant=mode.startswith("reentrant")))
    else:
        out = model(x)
    torch.nn.functional.cross_entropy(out, y).backward()
    opt.step()
    if mode == "validation without eval()":
        with torch.no_grad():
            model(x).sum()
    elif mode == "validation in eval mode":
        model.eval()
        with torch.inference_mode():
            model(x).sum()


def _recorded(mode: str):
    import torch

    import gpumagic

    backbone, head, model = _model()
    opt = torch.optim.SGD(head.parameters() if mode.startswith("frozen part") else model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with gpumagic.profile(steps=STEPS, skip=1, display=False) as run:
            for _ in range(STEPS + 3):
                _step(mode, backbone, head, model, opt, x, y)
    return run.report


@pytest.mark.parametrize(("mode", "calls"), [("validation without eval()", 2 * STEPS),
                                             ("frozen part in training mode", STEPS)])
def test_dropout_drawing_masks_under_no_grad_in_a_training_loop_fires(mode, calls):
    """Two dropout layers a validation, each step followed by one; the frozen backbone's one dropout
    layer a step (the head's runs with grad mode on, in the trained forward)."""
    f = _recorded(mode).finding(ID)
    assert f is not None and f.severity == "medium" and f.est_gain == 0
    assert f.evidence.numbers["active_no_grad_dropout_calls"] == calls
    assert f.evidence.numbers["trained_dropout_calls"] == (2 if mode.startswith("validation") else 1) * STEPS
    codes = [fix.code for fix in f.fixes]
    assert "model.eval()" in codes[0] and "model.train()" in codes[0] and "backbone.eval()" in codes[1]
    assert "under no_grad" in f.title


@pytest.mark.parametrize("mode", ["validation in eval mode", "frozen part in eval mode", "reentrant checkpoint",
                                  "non-reentrant checkpoint", "training only"])
def test_eval_mode_checkpoints_and_training_alone_are_silent(mode):
    """A reentrant checkpoint runs its first forward under no_grad with dropout on, by design:
    inside ``CheckpointFunction``, which records a sequence number (a custom autograd Function)."""
    assert _recorded(mode).finding(ID) is None


def _exported(tmp_path, strip) -> str:
    """A validation without ``model.eval()`` after each of four steps, recorded with torch.profiler
    and exported; ``strip(name)`` says which events lose their ``Sequence number``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    backbone, head, model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    path = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            _step("validation without eval()", backbone, head, model, opt, x, y)
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if strip(e.get("name", "")) and isinstance(e.get("args"), dict):
            e["args"].pop("Sequence number", None)
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_plain_profiler_trace_fires(tmp_path):
    f = analyze(_exported(tmp_path, lambda name: False)).finding(ID)
    assert f is not None and f.evidence.numbers["active_no_grad_dropout_calls"] == 8


def test_a_trace_without_numbers_is_not_judged(tmp_path):
    """Backward events without numbers, or forward operators without numbers (a profiler that
    writes none): grad mode cannot be told, nothing is judged."""
    assert analyze(_exported(tmp_path, lambda name: "Backward" in name)).finding(ID) is None
    assert analyze(_exported(tmp_path, lambda name: "Backward" not in name)).finding(ID) is None


def test_a_teacher_in_training_mode_fires():
    """Distillation: the teacher, the only model with dropout, runs under no_grad in training mode
    (teacher.eval() forgotten) and never in grad mode; the student trains. The trace numbers its
    operators (the student's), so the teacher's calls without numbers are read."""
    torch = pytest.importorskip("torch")
    import gpumagic

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                  torch.nn.Linear(32, 4))
    student = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    reports = {}
    for mode in ("train", "eval"):
        getattr(teacher, mode)()
        with gpumagic.profile(steps=STEPS, display=False) as run:
            for _ in range(STEPS + 3):
                with torch.no_grad():
                    targets = teacher(x).softmax(1)
                loss = torch.nn.functional.kl_div(student(x).log_softmax(1), targets, reduction="batchmean")
                opt.zero_grad()
                loss.backward()
                opt.step()
        reports[mode] = run.report
    f = reports["train"].finding(ID)
    assert f.evidence.numbers["active_no_grad_dropout_calls"] == STEPS and f.evidence.numbers["trained_dropout_calls"] == 0
    assert reports["eval"].finding(ID) is None
