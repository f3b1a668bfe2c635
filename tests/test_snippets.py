"""Every fix gpumagic prints is proven: it compiles and names only APIs the installed torch and
transformers have (tests/snippets_check.py), and it runs on CPU where it can (a tiny model and
loader in scope, every ``"cuda"`` made ``"cpu"``). Snippets that need CUDA run in
scripts/gpu_check.py on a GPU machine. The fixes come from tests/snippets_collect.py: the analysis
of every fixture trace plus built traces firing every rule, so a new rule is covered at once."""

from __future__ import annotations

import gc
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


@pytest.fixture(autouse=True, scope="module")
def _no_source_files_left():
    """The snippets' source files (snippets_check._source_file) go when this module is done."""
    yield
    ck.remove_source_files()


def test_every_finding_id_has_fixes_collected():
    assert {fid for fid, _, _ in FIXES.values()} == set(FINDING_IDS)


@pytest.mark.parametrize("code", PARAMS)
def test_fix_names_only_apis_that_exist(code):
    problems, not_installed = ck.check(code)  # names from modules not installed here stay unchecked
    assert problems == []
    if not_installed:  # e.g. Triton, which the CPU build of torch does not bring
        pytest.skip(f"{', '.join(sorted(set(not_installed)))} not installed: the names this fix takes from it are unchecked")


#: The intra-op thread count a fix runs under: no fix sets this one, so setting any is seen.
SENTINEL_THREADS = 7


def _in_float64(ns: dict) -> None:
    """The harness as a float64 finding sees it: the model and its input made float64."""
    ns["model"].double()
    ns["x"] = ns["x"].double()


#: What the harness must be like before a finding's fixes run, for the fix to have something to
#: change (a cast to float32 does nothing to a float32 model), and what must hold after.
BEFORE = {"cpu-float64": _in_float64}
AFTER = {"cpu-float64": lambda ns: all(p.dtype == ns["torch"].float32 for p in ns["model"].parameters())
         and (ns["x"].dtype == ns["torch"].float32 or ns["out"].dtype == ns["torch"].float32)}


@pytest.mark.parametrize("code", [p for p in PARAMS if FIXES[p.values[0]][1].flavor == "pytorch"
                                  and not ck.needs_cuda(p.values[0]) and ck.has_statements(p.values[0])])
def test_fix_runs_on_cpu(code, tmp_path, monkeypatch):
    """Run in an empty folder with an empty home: a fix that writes files must write them where the
    fix says (a cache folder it names), and the test must leave nothing behind in the checkout."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    calls: list = []
    ns = sc.harness("cpu", calls)
    fid = FIXES[code][0]
    BEFORE.get(fid, lambda ns: None)(ns)
    ns["model"](ns["x"]).sum().backward()  # gradients in place: a fix that drops them did something
    before = dict(ns)
    precision = torch.backends.cuda.matmul.fp32_precision
    threads = torch.get_num_threads()
    torch.set_num_threads(SENTINEL_THREADS)  # a fix that sets the thread count changes it from this
    anomaly = "set_detect_anomaly" in code   # a fix that turns anomaly mode off: on before it, to see it change
    torch.autograd.set_detect_anomaly(anomaly)
    frozen = gc.get_freeze_count()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory=True without an accelerator warns
            ck.run(code, ns, "cpu")
        changed = (precision != torch.backends.cuda.matmul.fp32_precision or torch.get_num_threads() != SENTINEL_THREADS
                   or torch.is_anomaly_enabled() != anomaly or any(p.grad is None for p in before["model"].parameters())
                   or "forward" in getattr(ns.get("lm"), "__dict__", {}))  # a forward compiled in place (generate's)
    finally:
        torch.autograd.set_detect_anomaly(False)  # the test process never keeps the mode on
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.set_num_threads(threads)  # a set_num_threads fix: the test process keeps its threads
        if gc.get_freeze_count() > frozen:  # a gc.freeze() fix: the test process keeps collecting
            gc.unfreeze()
    # it ran to the end and did something: bound or rebound a name, trained, logged or set a switch
    rebound = {k for k, v in ns.items() if k != "__builtins__" and (k not in before or before[k] is not v)}
    assert rebound or calls or changed
    assert AFTER.get(fid, lambda ns: True)(ns), f"the fix for {fid} did not do what it says"
    assert not [p.name for p in tmp_path.iterdir() if p.name != "home"], "a fix wrote into the current folder"


def test_the_checker_rejects_apis_that_do_not_exist():
    assert ck.check("torch.cuda.no_such_thing()")[0]
    assert ck.check("torch.backends.cuda.matmul.fp32_precison = 'tf32'")[0]
    assert ck.check("t.record_streams(s)")[0]
    assert ck.check("TrainingArguments(..., torch_compile_modes='max-autotune')")[0]
    assert ck.check("TrainingArguments(..., accelerator_config={'nonblocking': True})")[0]
    assert ck.check("opt = torch.optim.AdamW(model.parameters(), fuse=True)")[0]


def test_magic_lines_in_fixes_parse():
    import getopt

    from IPython.core.magic_arguments import parse_argstring
    from IPython.utils.process import arg_split

    from gpumagic.shells.magic import GpuProfileMagics

    lines = [m for code in FIXES for m in ck.magic_lines(code)[1]]
    assert lines
    for line in lines:
        name, _, args = line.lstrip("%").partition(" ")
        assert name in ("gpuprofile", "prun")
        if name == "gpuprofile":
            parse_argstring(GpuProfileMagics.gpuprofile, args)
        else:  # IPython's %%prun reads its options with getopt and this spec (IPython/core/magics/execution.py)
            opts, rest = getopt.getopt(arg_split(args, posix=False), "D:l:rs:T:q")
            assert opts and not rest


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


def test_fixes_import_the_optional_packages_they_use():
    """Pasted alone, a fix must run: Triton, torchvision and torch.distributed names are imported
    by the fix itself, never assumed in scope (the CPU build of torch brings no Triton)."""
    import ast

    optional = {"triton": "triton", "tl": "triton.language", "torchvision": "torchvision", "dist": "torch.distributed"}
    for code in FIXES:
        tree = ast.parse(ck.magic_lines(code)[0])
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} & set(optional)
        bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names}
        assert used <= bound, (sorted(used - bound), code)


# ---- the gpu-idle-gaps straggler probe, on a two-rank gloo job -----------------------------------

@pytest.mark.slow  # two fresh processes import torch
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

@pytest.mark.slow  # two Trainer runs
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


# ---- unfused-attention: SDPA computes what the hand-written attention did ------------------------

def _sdpa_line() -> str:
    from gpumagic.analysis.rules.kernels import SDPA_CODE

    return next(line for line in SDPA_CODE.splitlines() if line.startswith("out = F.scaled_dot_product_attention("))


def _by_hand(q, k, v, scale, hide=None, add=None):
    import torch

    scores = (q @ k.transpose(-2, -1)) * scale
    if hide is not None:
        scores = scores.masked_fill(hide, float("-inf"))
    if add is not None:
        scores = scores + add
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("scale", [1.0, 0.125, 0.3])  # 1.0: T5 (no scaling); 0.125 = 1/√64 is SDPA's default for d=64
def test_sdpa_fix_keeps_the_scale_and_the_masked_fill_mask(scale):
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 64, generator=g) for _ in range(3))
    hide = torch.rand(5, 5, generator=g) > 0.6
    hide[:, 0] = False  # every query keeps a key (an all-hidden row is NaN by hand)
    ns = {"F": F, "q": q, "k": k, "v": v, "mask": hide, "scale": scale, "p": 0.1, "training": False}
    exec(_sdpa_line(), ns)
    torch.testing.assert_close(ns["out"], _by_hand(q, k, v, scale, hide=hide))
    # the replacement printed before issue 23 (no scale=, attn_mask=mask) computes something else
    old = F.scaled_dot_product_attention(q, k, v, attn_mask=hide)
    assert not torch.allclose(old, _by_hand(q, k, v, scale, hide=hide), atol=1e-3)


def test_sdpa_mask_conventions_the_fix_names():
    """True = attend for a boolean attn_mask (pass the mask itself), a float mask is added."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 16, generator=g) for _ in range(3))
    keep = torch.rand(5, 5, generator=g) > 0.4
    keep[:, 0] = True
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.5),
                               _by_hand(q, k, v, 0.5, hide=~keep))
    add = torch.randn(5, 5, generator=g)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.5),
                               _by_hand(q, k, v, 0.5, add=add))
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # masked_fill style: the future is hidden
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5),
                               _by_hand(q, k, v, 0.5, hide=causal))


# ---- elementwise-bound: the Triton kernel computes in fp32 and stores the output's dtype ----------

_TRITON_RUN = r"""
import sys
import torch
import torch.nn.functional as F
from gpumagic.analysis.rules.kernels import TRITON_CODE

old_body = '''
import triton
import triton.language as tl

@triton.jit
def bias_gelu(x_ptr, b_ptr, out_ptr, n, d, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n) + tl.load(b_ptr + i % d, mask=i < n)
    tl.store(out_ptr + i, 0.5 * x * (1 + tl.erf(x * 0.7071067811865476)), mask=i < n)

out = torch.empty_like(x)
bias_gelu[(triton.cdiv(x.numel(), 1024),)](x, bias, out, x.numel(), x.shape[-1], BLOCK=1024)
'''
sys.path.insert(0, sys.argv[1])
import snippets_check as ck

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    x = torch.randn(3, 700, dtype=dtype)  # 2,100 elements: three blocks, the last one masked
    bias = torch.randn(700, dtype=dtype)
    ns = ck.run(TRITON_CODE, {"torch": torch, "x": x, "bias": bias}, "cpu")
    assert ns["out"].dtype == dtype
    torch.testing.assert_close(ns["out"], F.gelu(x.float() + bias.float()).to(dtype))
    if dtype != torch.float32:  # the kernel printed before issue 23 does not compile for it
        try:
            ck.run(old_body, {"torch": torch, "x": x, "bias": bias}, "cpu")
        except Exception as exc:
            assert "fp32" in str(exc), exc
        else:
            raise AssertionError(f"the fp16/bf16 erf kernel compiled for {dtype}")
print("ok")
"""


@pytest.mark.slow  # a fresh process imports torch and triton
def test_triton_fix_runs_for_fp32_fp16_and_bf16_under_the_interpreter(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton", reason="Triton is not installed (it ships with CUDA builds of torch): "
                                         "test_triton_fix_computes_in_fp32_by_its_source checks the source instead")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _TRITON_RUN, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_triton_fix_computes_in_fp32_by_its_source():
    """Without Triton: the kernel loads into fp32 before tl.erf and casts to the output's dtype."""
    import ast

    from gpumagic.analysis.rules.kernels import TRITON_CODE

    tree = ast.parse(TRITON_CODE)
    assert {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names} >= {"triton", "triton.language"}
    kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    loads = [c for c in ast.walk(kernel) if isinstance(c, ast.Call) and ast.unparse(c.func) == "tl.load"]
    casts = [c for c in ast.walk(kernel) if isinstance(c, ast.Call) and ast.unparse(c.func).endswith(".to")]
    assert loads and all(any(c.func.value is ld for c in casts) and ast.unparse(c.args[0]) == "tl.float32"
                         for ld in loads for c in casts if c.func.value is ld)
    assert len([c for c in casts if ast.unparse(c.args[0]) == "tl.float32"]) == len(loads)  # every load cast
    store = next(c for c in ast.walk(kernel) if isinstance(c, ast.Call) and ast.unparse(c.func) == "tl.store")
    assert ast.unparse(store.args[1]).endswith(".to(out_ptr.dtype.element_ty)")


# ---- memory-pressure: the lower precision and the checkpointing argument fit the GPU and version ---

def test_memory_fixes_pick_the_dtype_by_compute_capability_and_the_installed_argument_name():
    import re

    from gpumagic.analysis.rules.memory import checkpointing_argument

    reports = dict(sc.built_reports())
    for label, use, avoid in (("memory-infer", "torch.bfloat16", "torch.float16"),
                              ("memory-volta-False", "torch.float16", "torch.bfloat16"),
                              ("memory-train", "bf16=True", "fp16=True"), ("memory-volta-True", "fp16=True", "bf16=True")):
        codes = "\n".join(fx.code for fx in reports[label].finding("memory-pressure").fixes)
        assert re.search(rf"\b{use}", codes) and not re.search(rf"\b{avoid}", codes), label
        if "=" in use:
            assert f"{checkpointing_argument()}=True" in codes and f"autocast to {use[:4]}" in codes, label
    try:
        import dataclasses

        from transformers import TrainingArguments
    except ImportError:
        return
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    expected = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    assert checkpointing_argument() == expected
