"""``cpu-low-precision-slow``: bfloat16/float16 matrix work on a CPU without instructions for it.
On the CPU-feature table, built bundles that vary one condition at a time, and a recorded loop."""

from __future__ import annotations

import os

import pytest
from tracebuilder import DATA, TraceBuilder

from gpumagic import analyze
from gpumagic.analysis.cpuprecision import support
from gpumagic.capture.machine import cpu_flags

ID = "cpu-low-precision-slow"
AVX2 = ["avx2"]
AVX512 = ["avx2", "avx512bw", "avx512dq", "avx512f", "avx512vl"]
ZEN4 = [*AVX512, "avx512_bf16"]  # bfloat16 native, float16 not
SPR = [*AVX512, "amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16"]


@pytest.mark.parametrize(("arch", "flags", "bf16", "fp16"), [
    ("x86_64", AVX2, "none", "none"),
    ("x86_64", [], "none", "none"),
    ("x86_64", AVX512, "emulated", "none"),
    ("x86_64", ZEN4, "native", "none"),
    ("x86_64", ["avx2", "amx_bf16"], "native", "none"),
    ("x86_64", SPR, "native", "native"),
    ("aarch64", ["bf16", "asimdhp"], "native", None),
    ("aarch64", ["asimdhp"], "none", None),
    ("x86_64", None, None, None),  # a bundle without the features: unknown
    ("ppc64le", [], None, None),
    ("x86_64", "avx2", None, None),  # not a list: unknown
])
def test_the_cpu_feature_table(arch, flags, bf16, fp16):
    assert support({"arch": arch, "cpu_flags": flags}) == {"bf16": bf16, "fp16": fp16}


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n\n"
                   "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(x86) == ["amx_tile", "avx2", "avx512_bf16", "avx512f"]  # the first processor's, sorted
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd asimdhp bf16 sve i8mm\n")
    assert cpu_flags(arm) == ["asimdhp", "bf16", "sve"]
    assert cpu_flags(tmp_path / "missing") is None
    (tmp_path / "bare").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "bare") is None


def bundle(flags: list[str] | None = AVX2, *, autocast: bool = True, typed: str | None = None, gpu: bool = False,
           steps: int = 5, cast_in: str = "aten::linear", threads: int | None = 2, arch: str = "x86_64",
           training: bool = True) -> dict:
    """Five 20 ms CPU steps: a forward ``aten::linear`` of 8 ms (an ``aten::addmm`` inside; with
    ``autocast``, as PyTorch records it, autocast's casts and then the inner ``aten::linear``
    holding the addmm: inside ``cast_in``; ``"vmap"``: the addmm nested in an addmm, as
    torch.func's batching rules run it, with a scalar's cast inside an ``aten::mul`` there), a
    backward ``aten::mm`` of 6 ms on the autograd thread, and an ``aten::mul`` holding a scalar's
    ``aten::to`` as FP32 code does; an optimizer step with ``training``. ``typed`` records the
    linear's input type (``c10::BFloat16``, ``float``...)."""
    tb = TraceBuilder(cc=(8, 0) if gpu else None)
    types = {"Input type": [typed, typed, typed], "Input Dims": [[128, 512], [1024, 512], [1024]]} if typed else {}
    for i in range(steps):
        t = i * 20_000
        tb.step(i + 1, t, 20_000)
        tb.add(cat="cpu_op", name="aten::linear", ts=t + 100, dur=8_000, args=types)
        if autocast and cast_in == "aten::linear":
            tb.op("aten::to", t + 150, 300)
            tb.op("aten::_to_copy", t + 160, 280)
            tb.op("aten::linear", t + 490, 7_600)  # autocast calls the operator again, on the cast inputs
        tb.op("aten::addmm", t + 500, 7_500)
        if cast_in == "vmap":
            tb.op("aten::addmm", t + 510, 7_480)
            tb.op("aten::mul", t + 7_000, 400)
            tb.op("aten::to", t + 7_050, 100)
        if cast_in == "between":  # a user's .to() between operators, not autocast's
            tb.op("aten::to", t + 8_200, 300)
        tb.op("aten::mul", t + 8_600, 200)
        tb.op("aten::to", t + 8_620, 20)  # a Python scalar wrapped: FP32 code casts inside mul
        tb.op("aten::mm", t + 9_000, 6_000, tid=200)
        if training:
            tb.op("Optimizer.step#AdamW.step", t + 19_000, 500)
        if gpu:
            tb.kernel("k", t + 300, 50, launch_ts=t + 250)
    d = tb.to_dict()
    machine = {"arch": arch, "cpu_model": "Test CPU", "cpu_count": 2, "usable_cores": 2.0, "cpu_flags": flags}
    if flags is None:
        del machine["cpu_flags"]
    d["gpumagic"] = {"format": 1, "label": "", "notes": [], "versions": {}, "clock": {"anchor_epoch_ns": None},
                     "capture": {"intra_op_threads": threads}, "machine": machine}
    return d


def test_autocast_on_an_avx2_cpu_fires_with_the_matrix_share_as_its_bound():
    r = analyze(bundle())
    f = r.finding(ID)
    assert f is not None and f.severity == "high"
    n = f.evidence.numbers
    assert n["autocast_calls"] == 5 and n["cpu_bf16"] == "none" and n["cpu_flags"] == "avx2"
    # the matrix operators: the linear (8 ms, the addmm inside) and the backward mm (6 ms) of each
    # 20 ms step; the bound: every operator (the mul and the optimizer step too)
    assert n["matrix_ops_frac"] == pytest.approx(14 / 20, abs=0.01)
    assert f.est_gain == pytest.approx(14.7 / 20, abs=0.01) and f.gain_method.startswith("upper bound")
    assert "16 bits" in f.title and "FP32 is faster" in f.title
    codes = [fx.code for fx in f.fixes]
    assert any("enabled=use_amp" in c for c in codes) and any(fx.diagnostic for fx in f.fixes)
    assert r.metrics.host.cpu_low_precision_calls == 5 and r.metrics.host.cpu_bf16 == "none"
    assert r.metrics.host.intra_op_threads == 2


def test_emulated_bfloat16_on_avx512_fires_and_says_so():
    f = analyze(bundle(AVX512)).finding(ID)
    assert f is not None and f.evidence.numbers["cpu_bf16"] == "emulated" and "converts each bfloat16" in f.why


@pytest.mark.parametrize(("why", "kwargs"), [
    ("bfloat16 native (Sapphire Rapids)", {"flags": SPR}),
    ("autocast may be bfloat16, native on Zen 4", {"flags": ZEN4}),
    ("no CPU features recorded (a plain trace or an older bundle)", {"flags": None}),
    ("a GPU run", {"gpu": True}),
    ("no autocast: FP32", {"autocast": False}),
    ("a user's .to() between operators", {"autocast": False, "cast_in": "between"}),
    ("torch.func.vmap's nested addmm casting a scalar inside", {"autocast": False, "cast_in": "vmap"}),
    ("one call is not a habit", {"steps": 1}),
    ("an architecture not read", {"arch": "ppc64le"}),
    ("recorded FP32 inputs", {"autocast": False, "typed": "float"}),
    ("recorded bfloat16 on a bfloat16 CPU", {"autocast": False, "typed": "c10::BFloat16", "flags": ZEN4}),
])
def test_it_stays_silent_when_a_condition_fails(why, kwargs):
    assert ID not in analyze(bundle(**kwargs)).finding_ids, why


def test_recorded_types_name_the_type_and_the_cast_back():
    """A model cast with .to(torch.float16) (no autocast) on a CPU with bfloat16 instructions but
    none for float16: the recorded input types tell which, and the fix casts the model back."""
    f = analyze(bundle(ZEN4, autocast=False, typed="c10::Half")).finding(ID)
    assert f is not None and f.title.startswith("Float16 matrix work") and f.evidence.numbers["fp16_calls"] == 5
    assert "AVX512_FP16" in f.why and "AVX512_BF16" not in f.why
    assert any("model.float()" in fx.code for fx in f.fixes)
    assert not any("enabled=use_amp" in fx.code for fx in f.fixes)


@pytest.mark.parametrize("typed", [None, "c10::BFloat16"])
def test_inference_gets_a_forward_pass_without_training_advice(typed):
    f = analyze(bundle(AVX2, autocast=typed is None, typed=typed, training=False)).finding(ID)
    assert f is not None and all(fx.flavor == "pytorch" for fx in f.fixes)
    assert not any("backward" in fx.code or "loss" in fx.code for fx in f.fixes)
    assert any("inference_mode" in fx.code for fx in f.fixes)


def test_host_cores_idle_believes_the_recorded_thread_count():
    """bfloat16 on an AVX2 CPU runs generic kernels on one thread: the intra-op threads idle though
    their count is 2. The recorded count rules out host-cores-idle's cause; a count of 1 states it."""
    from test_host_cores_idle import _bundle as idle_bundle

    two = idle_bundle(100.0, 100.0, 100.0)
    two["gpumagic"]["capture"] = {"intra_op_threads": 2}
    assert "host-cores-idle" not in analyze(two).finding_ids
    one = idle_bundle(100.0, 100.0, 100.0)
    one["gpumagic"]["capture"] = {"intra_op_threads": 1}
    f = analyze(one).finding("host-cores-idle")
    assert f is not None and f.evidence.summary.startswith("torch.get_num_threads() was 1.")


def test_the_recorded_loops():
    """Recorded on this project's 2-core AVX2 machine (tests/data/MANIFEST.md) by
    benchmarks/cpu_low_precision.py --record: two linear layers under bf16 autocast, and in FP32.
    There FP32 saved 0.93 of the bf16 step; the bound covers it. host-cores-idle stays silent on
    the bf16 loop, whose generic kernels ran on one of the two allowed threads."""
    bf16 = analyze(os.path.join(DATA, "cpu_autocast_bf16.json.gz"))
    f = bf16.finding(ID)
    assert f is not None and f.est_gain >= 0.93 and f.evidence.numbers["autocast_calls"] >= 2
    assert "host-cores-idle" not in bf16.finding_ids
    fp32 = analyze(os.path.join(DATA, "cpu_autocast_fp32.json.gz"))
    assert ID not in fp32.finding_ids and fp32.metrics.host.cpu_low_precision_calls == 0
    assert fp32.metrics.host.cpu_bf16 == "none"


def test_a_model_cast_to_float16_is_read_from_its_parameters():
    """tests/data/cpu_model_half.json.gz: the linear loop with model.half() on an AVX-512 CPU with
    bfloat16 instructions and no float16 ones, recorded without --shapes: no autocast and no input
    types, so it read nothing, though FP32 saved 0.952 of the step (181.6 → 8.7 ms). The optimizer's
    parameters, all float16, tell. With float16 instructions, or the parameters in bfloat16 on this
    CPU (native), it stays silent."""
    import copy
    import gzip
    import json

    path = os.path.join(DATA, "cpu_model_half.json.gz")
    f = analyze(path).finding(ID)
    n = f.evidence.numbers
    assert n["params_16bit_frac"] == 1.0 and n["fp16_calls"] == n["autocast_calls"] == 0 and n["cpu_fp16"] == "none"
    assert f.title.startswith("Float16 matrix work") and "are float16 (a model cast to 16 bits)" in f.evidence.summary
    assert f.fixes[0].code.startswith("model = model.float()") and f.est_gain >= 0.952
    with gzip.open(path, "rt") as fh:
        raw = json.load(fh)
    native = copy.deepcopy(raw)
    native["gpumagic"]["machine"]["cpu_flags"] = SPR
    assert analyze(native).finding(ID) is None
    bf16 = copy.deepcopy(raw)
    held = bf16["gpumagic"]["capture"]["optimizer_parameter_elements"]
    bf16["gpumagic"]["capture"]["optimizer_parameter_elements"] = {"bfloat16": held["float16"]}
    assert analyze(bf16).finding(ID) is None  # avx512_bf16: native here
    half_of_it = copy.deepcopy(raw)
    half_of_it["gpumagic"]["capture"]["optimizer_parameter_elements"] = {"float16": 10, "float32": 90}
    assert analyze(half_of_it).finding(ID) is None  # a few 16-bit parameters are no model cast


def test_a_capture_records_the_cpu_features_and_the_thread_count():
    torch = pytest.importorskip("torch")
    import gpumagic

    with gpumagic.profile(steps=1) as run:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert run.report.metrics.host.intra_op_threads == torch.get_num_threads()
    flags = cpu_flags()
    assert run.report.metrics.host.cpu_bf16 == support({"arch": os.uname().machine, "cpu_flags": flags})["bf16"]


def test_per_sample_gradients_with_torch_func_are_not_autocast():
    """torch.func's vmap nests each matrix operator in itself and casts Python scalars deep
    inside (a recorded FP32 loop once read as 16 matrix calls under autocast); the same model
    under CPU autocast is counted."""
    torch = pytest.importorskip("torch")
    from torch.func import functional_call, grad, vmap

    import gpumagic

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    with gpumagic.profile(display=False) as fp32:
        for _ in range(3):
            vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert fp32.report.metrics.host.cpu_low_precision_calls == 0 and ID not in fp32.report.finding_ids
    with gpumagic.profile(display=False) as amp:
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            torch.nn.functional.cross_entropy(out.float(), y).backward()
    assert amp.report.metrics.host.cpu_low_precision_calls >= 2  # both linear layers, every call
