"""Formatting helpers shared by the text, HTML and widget renders."""

import math

import pytest

from gpumagic.render._format import (
    MISSING,
    evidence_items,
    fmt_bytes,
    fmt_gain,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_span_ms,
    severity_label,
    short_kernel_name,
)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0.0042, "4 µs"), (0.5, "500 µs"), (12.34, "12.3 ms"), (176.8, "177 ms"), (1065.6, "1.07 s"), (None, MISSING)],
)
def test_fmt_ms_picks_a_unit(ms, text):
    assert fmt_ms(ms) == text


def test_missing_and_non_finite_values_print_as_missing():
    assert fmt_pct(None) == MISSING
    assert fmt_pct(math.nan) == MISSING
    assert fmt_bytes(-1) == MISSING
    assert fmt_number(math.inf) == MISSING


def test_bytes_use_binary_units():
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * 2**30) == "3.0 GiB"


def test_numbers_keep_three_significant_digits_and_group_thousands():
    assert fmt_number(0.0136123) == "0.0136"
    assert fmt_number(6080) == "6,080"
    assert fmt_number(1234.56) == "1,235"
    assert fmt_number(True) == "yes"
    assert fmt_number("fp32") == "fp32"


def test_gain_is_phrased_as_an_upper_bound():
    assert fmt_gain(0.334) == "up to 33 % of step time"
    assert fmt_gain(0.001) == "under 1 % of step time"
    assert fmt_gain(None) == "gain unknown"


def test_an_estimated_gain_is_not_called_an_upper_bound():
    assert fmt_gain(0.334, "estimate: the wait workers hide, assuming ...") == "about 33 % of step time (estimate)"
    assert fmt_gain(0.334, "upper bound: the wait") == "up to 33 % of step time"


def test_severity_has_an_icon_and_a_word_and_icons_differ():
    labels = {s: severity_label(s) for s in ("high", "medium", "low")}
    assert [label.split()[1] for label in labels.values()] == ["High", "Medium", "Low"]
    assert len({label.split()[0] for label in labels.values()}) == 3
    assert severity_label("high", icon=False) == "High"


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*, int)",
         "max_pool_forward_nchw<float, float>"),
        ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "computeOffsetsKernel"),
        ("volta_sgemm_128x64_nn", "volta_sgemm_128x64_nn"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "ncclKernel_AllReduce_RING_LL_Sum_float"),
    ],
)
def test_short_kernel_name_drops_void_namespaces_and_parameters(name, short):
    assert short_kernel_name(name) == short


def test_short_kernel_name_truncates_with_an_ellipsis():
    out = short_kernel_name("k" * 100, max_chars=20)
    assert len(out) == 20 and out.endswith("…")


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("gpu_idle_during_wait_frac", 0.334, "GPU idle while waiting: 33.4 %"),
        ("compute_capability", 7, "Compute capability: 7.0"),
        ("dataloader_ms", 415.8, "Data-loader wait: 416 ms"),
        ("pageable_bytes", 115_607_040, "Pageable copies: 110.3 MiB"),
        ("median_kernel_us", 4.2, "Median kernel duration: 4 µs"),
        ("comm_ms", 3.21, "Communication time: 3.2 ms"),
        ("sync_calls", 4, "Sync calls: 4"),
        ("first_over_median", 2.5, "First step / median step: 2.50×"),
        ("source", "allocator", "Source: allocator"),
    ],
)
def test_evidence_numbers_read_as_labelled_values_with_units(key, value, text):
    [(label, shown)] = evidence_items({key: value})
    assert f"{label}: {shown}" == text


def test_a_window_never_reads_as_two_equal_ends():
    assert fmt_span_ms(120.31, 131.0) == "120.3–131.0 ms"
    assert fmt_span_ms(71.099, 71.1) == "71.10 ms for 1 µs"
    assert fmt_span_ms(1.0, 1.04) == "1.00 ms for 40 µs"


def test_a_report_without_steps_says_what_its_gains_are_a_share_of():
    """A gain is a share of the window: the recorded steps when there are any ("of step time"), else
    the whole profiled window (an inference loop, a vLLM engine trace: "of the profiled time")."""
    import os

    from tracebuilder import DATA

    from gpumagic import analyze
    from gpumagic.render._format import PROFILED_TIME, STEP_TIME, fmt_gain, gain_basis

    assert fmt_gain(0.25, "x", PROFILED_TIME) == "up to 25 % of the profiled time"
    assert fmt_gain(0.25, "estimate: y") == "about 25 % of step time (estimate)"
    none = analyze(os.path.join(DATA, "mi300_vllm_decode_fullgraph_capture.json.gz"))
    some = analyze(os.path.join(DATA, "resnet50_v100_workers0.json.gz"))
    assert none.metrics.steps.count == 0 and gain_basis(none) == PROFILED_TIME and gain_basis(some) == STEP_TIME
    for text in (none.to_text(), none.to_html()):
        assert "of the profiled time" in text and "of step time" not in text
    assert "of step time" in some.to_text() and "of the profiled time" not in some.to_text()


def test_evidence_keys_whose_unit_is_not_their_suffix_show_it():
    """``frequent-checkpoints`` names its shares ``save_frac_of_steps`` and its times
    ``save_ms_mean``, ``warmup-in-window`` its shares by segment kind: they read as shares, times,
    ratios and rates, not bare numbers."""
    items = dict(evidence_items({"save_frac_of_steps": 0.445, "save_frac_recorded": 0.474, "save_ms_mean": 22.2,
                                 "train_ms_per_step": 27.8, "kernel_ms_per_step": 3.0}))
    assert items == {"Saves' share of the steps": "44.5 %", "Saves' share of the recorded steps": "47.4 %",
                     "Time per save (mean)": "22.2 ms", "Training time per step (mean)": "27.8 ms",
                     "Kernel time per step": "3.0 ms"}
    more = dict(evidence_items({"cold_start": 0.8813, "excess_frac_after_recording": 0.6873, "slowest_stage_share": 0.8086,
                                "idle_core_threads_gain": 0.4167, "slowest_stage_ms_per_batch": 0.2218,
                                "projection_growth": 1.82, "main_thread_core_use": 0.1561, "gflops_per_step": 0.01,
                                "cpu_ref_gflops": 100.0}))
    assert list(more.values()) == ["88.1 %", "68.7 %", "80.9 %", "41.7 %", "222 µs", "1.82×", "15.6 % of a core",
                                   "0.01 GFLOP", "100 GFLOP/s"]
