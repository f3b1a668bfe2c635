"""Issue 31: what the trace can support — the model on the CPU, no GPU activity recorded, an
empty window, counter mode, other accelerators, no device properties, a partial window."""

from tracebuilder import TraceBuilder, busy_steps

import gpumagic


def analyze(tb):
    return gpumagic.analyze(tb.to_dict())


def _cpu_ops(tb, n=60):
    for i in range(n):
        tb.op("aten::addmm", 100 + i * 100, 90)


def test_the_model_on_the_cpu_with_the_cuda_runtime_recorded():
    tb = TraceBuilder()
    tb.runtime("cudaGetDeviceCount", 0, 5)
    _cpu_ops(tb)
    r = analyze(tb)
    f = r.finding("model-on-cpu")
    assert f is not None and '.to(device' in f.fixes[0].code and 'torch.device("cuda")' in f.fixes[0].code
    assert not any("CPU activity only" in n for n in r.notes)


def test_no_gpu_runtime_at_all_is_a_note_not_model_on_cpu():
    tb = TraceBuilder(cc=None)
    _cpu_ops(tb)
    r = analyze(tb)
    assert "model-on-cpu" not in r.finding_ids
    assert any("ProfilerActivity.CUDA" in n for n in r.notes)


def test_a_gpu_model_is_not_on_the_cpu():
    tb = TraceBuilder()
    _cpu_ops(tb)
    for i in range(20):
        tb.kernel("k", 100 + i * 300, 100, launch_ts=95 + i * 300)
    assert "model-on-cpu" not in analyze(tb).finding_ids


def test_a_replayed_graph_is_the_model_on_the_gpu():
    """A serving engine's window cut before its graph's kernels (the real MI300X vLLM decode trace
    cut at a quarter: 99 host operators preparing inputs, 5 launches, no kernel yet): one graph
    launch replays the model's kernels, so the model is on the GPU."""
    for name in ("hipGraphLaunch", "cudaGraphLaunch"):
        tb = TraceBuilder()
        tb.runtime("hipGetDeviceCount", 0, 5)
        _cpu_ops(tb)
        tb.runtime(name, 7_000, 20)
        assert "model-on-cpu" not in analyze(tb).finding_ids


def test_an_empty_window_is_not_analysed():
    tb = TraceBuilder()
    for i in range(3):
        tb.step(i + 1, i * 10_000, 10_000)
    r = analyze(tb)
    assert r.findings == [] and any("Almost nothing was recorded" in n for n in r.notes)
    tb.op("aten::mm", 100, 50)  # one operator is something: analysed as usual
    assert not any("Almost nothing" in n for n in analyze(tb).notes)


def test_counter_mode_and_other_accelerators_get_their_own_note():
    tb = TraceBuilder()
    tb.runtime("cudaLaunchKernel", 0, 5)
    tb.add(cat="cuda_profiler_range", name="gemm_kernel", ts=10, dur=100, args={"device": 0})
    _cpu_ops(tb, 5)
    r = analyze(tb)
    assert any("Counter-mode trace" in n for n in r.notes)
    assert not any("CPU activity only" in n for n in r.notes)
    tb = TraceBuilder(cc=None)
    tb.add(cat="mtia_runtime", name="mtiaLaunchKernel", ts=0, dur=10)
    _cpu_ops(tb, 5)
    r = analyze(tb)
    assert any("non-GPU accelerator (mtia_runtime" in n for n in r.notes)


def test_no_device_properties_note():
    tb = TraceBuilder(cc=None)
    busy_steps(tb, 3, 10_000, 9_000, kernel_name="volta_sgemm_128x64_nn")
    r = analyze(tb)
    assert any("No deviceProperties" in n and "7.0" in n for n in r.notes)
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    assert not any("No deviceProperties" in n for n in analyze(tb).notes)


def test_a_window_cut_from_a_longer_trace():
    tb = TraceBuilder()
    tb.op("aten::copy_", 0, 10)
    tb.memcpy("Memcpy HtoD (Pinned -> Device)", 8_000, 50, 1 << 20, launch_ts=1)  # queued 8 ms, nothing before
    tb.kernel("k", 8_100, 5_000, launch_ts=20)
    r = analyze(tb)
    assert any("partial window" in n for n in r.notes)
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    assert not any("partial window" in n for n in analyze(tb).notes)


def test_expert_parallel_kernels_count_as_communication():
    from gpumagic.analysis import names as nm

    for name in ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)",
                 "void dpsk::ep::combine_kernel<bf16>(...)", "nvshmemi_transfer_kernel", "mscclKernel_Sum_half"):
        assert nm.is_collective(name)
    tb = TraceBuilder()
    for i in range(3):
        t = i * 10_000
        tb.step(i + 1, t, 10_000)
        tb.kernel("sgemm_compute", t + 10, 6_000, launch_ts=t + 1)
        tb.kernel("void deep_ep::internode::dispatch<true, 8>(int4*)", t + 6_100, 2_500, launch_ts=t + 2, stream=20)
    r = analyze(tb)
    assert r.metrics["communication"]["count"] == 3 and "communication-heavy" in r.finding_ids


def test_unrecognised_communication_is_noted():
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    tb.op("record_param_comms", 100, 50)
    r = analyze(tb)
    assert r.metrics["communication"]["maybe_undercounted"] is True
    assert any("undercounted" in n for n in r.notes)
    tb = TraceBuilder()
    busy_steps(tb, 3, 10_000, 9_000)
    assert not any("undercounted" in n for n in analyze(tb).notes)


def _counter_steps(tb, dataloader_us=0.0, launches=100):
    for s in range(5):
        t0 = s * 20_000
        tb.step(s + 1, t0, 20_000)
        if dataloader_us:
            tb.dataloader(t0, dataloader_us)
        for i in range(launches):
            t = t0 + 8_100 + i * 100
            tb.runtime("cudaLaunchKernel", t, 5)
            tb.add(cat="cuda_profiler_range", name="k", ts=t + 10, dur=50, args={"device": 0})
        for i in range(60):
            tb.op("aten::add", t0 + 100 + i * 130, 120)


def test_host_rules_are_not_run_on_a_counter_mode_trace():
    """Counter mode does not time kernels: a data-loader wait cannot be set against GPU idle time,
    nor can a few timed kernels say the model stayed on the CPU. Both rules fire on the same host
    side without the counter events, so the gate, not the data, keeps them silent."""
    for dataloader_us, launches, rule_id in ((8_000.0, 100, "dataloader-bound"), (0.0, 1, "model-on-cpu")):
        tb = TraceBuilder()
        _counter_steps(tb, dataloader_us, launches)
        r = analyze(tb)
        assert rule_id not in r.finding_ids
        note = next(n for n in r.notes if n.startswith("Counter-mode trace"))
        assert rule_id in note and "were not run" in note
        plain = TraceBuilder()  # the same host side, without the counter events: the rule judges it
        plain.events = [e for e in tb.events if e["cat"] != "cuda_profiler_range"]
        assert rule_id in analyze(plain).finding_ids


def test_a_trace_without_host_events_says_the_host_rules_were_not_run():
    tb = TraceBuilder()
    for i in range(300):  # kernels only, no launch calls, no operators: the host side was not recorded
        tb.add(cat="kernel", name="k_elementwise", ts=100 + i * 30, dur=4, pid=0, tid=7,
               args={"device": 0, "stream": 7, "correlation": 5000 + i})
    r = analyze(tb)
    assert any(n.startswith("No host event in the trace") and "launch-bound" in n for n in r.notes)
    assert not set(r.finding_ids) & {"launch-bound", "too-small-for-gpu", "cpu-bound"}
    assert "low-gpu-utilization" in r.finding_ids  # the GPU side is still judged


def _manual_training(optimizer: bool):
    """A small CPU loop under gpumagic.profile that updates its weights by hand (no torch.optim),
    or with torch.optim.SGD."""
    import torch

    import gpumagic

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer else None
    with gpumagic.profile(steps=3, nvml=False, display=False) as run:
        for _ in range(6):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            model.zero_grad()
            loss.backward()
            if opt is not None:
                opt.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
    return run.report


def test_training_without_an_optimizer_step_says_why_no_step_was_judged():
    notes = " ".join(_manual_training(optimizer=False).notes)
    assert "no torch.optim optimizer step" in notes and "torch.optim.SGD(model.parameters(), lr=lr)" in notes
    assert "no torch.optim optimizer step" not in " ".join(_manual_training(optimizer=True).notes)


def test_a_trace_from_elsewhere_without_steps_gets_no_optimizer_note():
    tb = TraceBuilder(cc=None)
    tb.op("aten::addmm", 0, 500)
    tb.op("autograd::engine::evaluate_function: AddmmBackward0", 600, 500)  # a backward, no step markers
    assert not any("no torch.optim optimizer step" in n for n in analyze(tb).notes)
