"""Issue 31: on a serving engine's window (vLLM-style traces: graph replays, the engine's capture
loop), findings give fixes that fit a server — engine arguments, CUDA-graph capture sizes, batch
scheduling, the engine's own profiler — each naming its public source, instead of training-loop
code (DataLoader, torch.compile(model), TrainingArguments, %%gpuprofile options)."""

import pytest
from recorded import analysed
from tracebuilder import TraceBuilder

import gpumagic
from gpumagic.analysis.advice.serving import SERVING_FIXES

TRAINING_LOOP = ("DataLoader", "TrainingArguments", "loss", "torch.compile(model", "%%gpuprofile", "optimizer")


def _text(f):
    return " ".join(fx.description + " " + fx.code for fx in f.fixes)


@pytest.mark.parametrize("name", ["mi300_vllm_decode_fullgraph", "mi300_vllm_decode_fullgraph_capture"])
def test_serving_fixtures_get_server_fixes(name):
    r = analysed(name)
    assert r.metrics.trace.workload == "serving"
    assert r.findings
    for f in r.findings:
        text = _text(f)
        for word in TRAINING_LOOP:
            assert word not in text, (f.id, word)
        if f.id in SERVING_FIXES:
            assert all(fx.code.startswith("# vLLM docs") for fx in f.fixes), f.id
            assert f.doc_url.startswith("https://docs.vllm.ai/")
    if name.endswith("capture"):  # start-up idle: profile after it, not "batch more"
        assert all("max_num_seqs" not in _text(f) for f in r.findings)


def _launch_bound(engine: bool):
    tb = TraceBuilder()
    for s in range(5):
        t0 = s * 2_000
        tb.step(s + 1, t0, 2_000)
        if engine:
            tb.op("vllm/v1/worker/gpu_model_runner.py(2100): execute_model", t0 + 1, 1_990, cat="python_function")
        for i in range(40):
            tb.op("aten::add", t0 + 5 + i * 48, 40)
            tb.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", t0 + i * 48 + 35, 8,
                      launch_ts=t0 + i * 48 + 25)
    return gpumagic.analyze(tb.to_dict())


def test_a_launch_bound_engine_is_told_about_its_graph_capture_sizes():
    served, plain = _launch_bound(engine=True), _launch_bound(engine=False)
    assert served.metrics.trace.workload == "serving" and plain.metrics.trace.workload == "inference"
    f, g = served.finding("launch-bound"), plain.finding("launch-bound")
    assert f is not None and g is not None
    assert "cudagraph_capture_sizes" in f.fixes[0].code and "enforce_eager=False" in f.fixes[0].code
    assert "torch.compile" not in _text(f)
    assert "torch.compile" in _text(g)  # the same work outside an engine keeps the PyTorch fix
    compile(f.fixes[0].code, "<fix>", "exec")  # valid Python as pasted


def test_every_serving_fix_is_valid_python_naming_its_source():
    for fid, fixes in SERVING_FIXES.items():
        for fx in fixes:
            compile(fx.code, f"<{fid}>", "exec")
            assert fx.code.splitlines()[0].startswith("# vLLM docs, "), fid
