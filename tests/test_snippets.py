"""Every fix gpumagic prints is proven: it compiles and names only APIs the installed torch and
transformers have (tests/snippets_check.py), and it runs on CPU where it can (a tiny model and
loader in scope, every ``"cuda"`` made ``"cpu"``). Snippets that need CUDA run in
scripts/gpu_check.py on a GPU machine. The fixes come from tests/snippets_collect.py: the analysis
of every fixture trace plus built traces firing every rule, so a new rule is covered at once."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import snippets_check as ck
import snippets_collect as sc

from gpumagic.analysis.rules import FINDING_IDS
from gpumagic.analysis.rules.transfers import PREFETCH_CODE

FIXES = sc.all_fixes()
PARAMS = [pytest.param(code, id=f"{fid}-{fx.flavor}-{i}") for i, (code, (fid, fx, _)) in enumerate(FIXES.items())]


def test_every_finding_id_has_fixes_collected():
    assert {fid for fid, _, _ in FIXES.values()} == set(FINDING_IDS)


@pytest.mark.parametrize("code", PARAMS)
def test_fix_names_only_apis_that_exist(code):
    problems, _not_installed = ck.check(code)  # names from modules not installed here stay unchecked
    assert problems == []


@pytest.mark.parametrize("code", [p for p in PARAMS if FIXES[p.values[0]][1].flavor == "pytorch"
                                  and not ck.needs_cuda(p.values[0]) and ck.has_statements(p.values[0])])
def test_fix_runs_on_cpu(code):
    import torch

    calls: list = []
    ns = sc.harness("cpu", calls)
    before = dict(ns)
    precision = torch.backends.cuda.matmul.fp32_precision
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory=True without an accelerator warns
            ck.run(code, ns, "cpu")
        changed = precision != torch.backends.cuda.matmul.fp32_precision
    finally:
        torch.backends.cuda.matmul.fp32_precision = precision
    # it ran to the end and did something: bound or rebound a name, trained, logged or set a switch
    rebound = {k for k, v in ns.items() if k != "__builtins__" and (k not in before or before[k] is not v)}
    assert rebound or calls or changed


def test_the_checker_rejects_apis_that_do_not_exist():
    assert ck.check("torch.cuda.no_such_thing()")[0]
    assert ck.check("torch.backends.cuda.matmul.fp32_precison = 'tf32'")[0]
    assert ck.check("t.record_streams(s)")[0]
    assert ck.check("TrainingArguments(..., torch_compile_modes='max-autotune')")[0]
    assert ck.check("TrainingArguments(..., accelerator_config={'nonblocking': True})")[0]
    assert ck.check("opt = torch.optim.AdamW(model.parameters(), fuse=True)")[0]


def test_magic_lines_in_fixes_parse():
    from IPython.core.magic_arguments import parse_argstring

    from gpumagic.shells.magic import GpuProfileMagics

    lines = [m for code in FIXES for m in ck.magic_lines(code)[1]]
    assert lines
    for line in lines:
        name, _, args = line.lstrip("%").partition(" ")
        assert name == "gpuprofile"
        parse_argstring(GpuProfileMagics.gpuprofile, args)


# ---- the transfer-bound prefetcher, with stand-in streams --------------------------------------

class _Stream:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


class _Cuda:
    def __init__(self, log: list):
        self.log = log
        self.active = _Stream("compute", log)

    def Stream(self):
        return _Stream("copy", self.log)

    @contextmanager
    def stream(self, s):
        prev, self.active = self.active, s
        try:
            yield
        finally:
            self.active = prev

    def current_stream(self):
        return self.active


class _Tensor:
    def __init__(self, ident, cuda: _Cuda, device="cpu"):
        self.ident, self.cuda, self.device = ident, cuda, device

    def to(self, device, non_blocking=False):
        self.cuda.log.append(("copy", self.ident, self.cuda.active.name, non_blocking))
        return _Tensor(self.ident, self.cuda, device)

    def record_stream(self, s):
        assert self.device == "cuda"
        self.cuda.log.append(("record", self.ident, s.name))


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_prefetch_trains_every_batch_once_in_order_with_stream_safety(n):
    log: list = []
    cuda = _Cuda(log)
    trained = []

    def data_loader(dataset, batch_size, pin_memory):
        assert pin_memory
        return [[_Tensor(("x", i), cuda), _Tensor(("y", i), cuda)] for i in range(dataset)]

    def train_step(x, y):
        assert x.device == y.device == "cuda" and x.ident[1] == y.ident[1]
        log.append(("train", x.ident[1]))
        trained.append(x.ident[1])

    ns = {"torch": SimpleNamespace(cuda=cuda), "DataLoader": data_loader, "dataset": n, "batch_size": 4,
          "train_step": train_step}
    exec(compile(PREFETCH_CODE, "<transfer-bound fix>", "exec"), ns)
    assert trained == list(range(n))  # each batch once, in order, the last one included
    assert all(e[2] == "copy" and e[3] is True for e in log if e[0] == "copy")  # side stream, non-blocking
    for i in range(n):
        train = log.index(("train", i))
        copied = max(log.index(("copy", (t, i), "copy", True)) for t in "xy")
        waits = [j for j, e in enumerate(log) if e == ("wait", "compute", "copy") and copied < j < train]
        assert waits, f"batch {i} trained without the compute stream waiting for its copy"
        for t in "xy":  # memory made on the copy stream is recorded on the compute stream before use
            assert copied < log.index(("record", (t, i), "compute")) < train
        if i + 1 < n:  # the next copy is queued after this batch's wait (so it overlaps this step)
            nxt = log.index(("copy", ("x", i + 1), "copy", True))
            assert waits[0] < nxt < train


# ---- the gpu-idle-gaps straggler probe, on a two-rank gloo job -----------------------------------

def test_straggler_probe_finds_a_straggler_slow_in_compute_and_one_slow_in_its_loader(tmp_path):
    """The probe names the slow rank in both cases; the step timed across its collectives (the
    method taught before) does not: equal on both ranks, or shortest on the straggler."""
    import json

    import snippets_dist as sd
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from gpumagic.analysis.rules.utilization import STRAGGLER_PROBE_CODE

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    assert any(code == STRAGGLER_PROBE_CODE.strip("\n") for code in FIXES)  # a fixture trace prints it
    mp.spawn(sd.run_rank, args=(2, str(tmp_path / "init"), STRAGGLER_PROBE_CODE, str(tmp_path)), nprocs=2)
    for case, part in (("compute", 1), ("loader", 0)):
        got = json.loads((tmp_path / f"{case}.json").read_text())
        probe = [row[part] for row in got["probe"]]
        assert max(range(2), key=probe.__getitem__) == sd.STRAGGLER, (case, got)
        assert probe[sd.STRAGGLER] >= 5 * sd.DELAY_S  # five timed batches, each delayed
        old = got["old"]
        if case == "compute":  # every rank waits in the all-reduce for the slow one
            assert abs(old[0] - old[1]) < 2 * sd.DELAY_S < min(old), (case, got)
        else:  # the straggler loaded before t0, and waits least in the all-reduce
            assert old[sd.STRAGGLER] < old[1 - sd.STRAGGLER], (case, got)


# ---- the Trainer's NaN/inf check: counted with the CPU profiler -----------------------------------

def test_trainer_tests_each_steps_loss_on_the_host_unless_the_host_sync_fix_is_applied(tmp_path):
    """With the default logging_nan_inf_filter=True the Trainer runs two host-side truth tests of
    the loss per step (isnan, isinf: host syncs on CUDA), at no logging step; the host-sync fix's
    setting removes them."""
    import ast

    pytest.importorskip("transformers")
    codes = [code for code, (fid, fx, _) in FIXES.items() if fid == "host-sync" and fx.flavor == "huggingface"]
    assert codes, "the host-sync finding has a TrainingArguments fix"
    call = ast.parse(codes[0]).body[0].value
    settings = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
    assert settings == {"logging_nan_inf_filter": False}
    steps = 4
    assert sc.trainer_host_checks(str(tmp_path / "default"), steps) == 2 * steps
    assert sc.trainer_host_checks(str(tmp_path / "fixed"), steps, **settings) == 0
