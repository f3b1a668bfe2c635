"""Name classification in time linear in the names (issue 24, class 6): the fast paths give the
same answers as the documented tables.

The speed itself is measured by ``benchmarks/name_classification.py`` (ratios against a real
trace), never here. What is checked: the folded patterns (case-sensitive, over lower-cased
names) and the all-names scans (``is_x.batch``) agree with the tables' own ``re.IGNORECASE``
patterns on every name of the traces in tests/data (but three whose names the others hold), on names built to hit the rewritten
branches and anchors, and on random text; a name past ``MAX_NAME_CHARS`` is classified on its
beginning, with a note in the report.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracebuilder import DATA, TraceBuilder, busy_steps

from gpumagic import analyze
from gpumagic.analysis import names as nm
from gpumagic.trace import load

#: Each classifier with what the tables say it is (the reference, one name at a time).
REFERENCE = {
    nm.is_step: lambda n: bool(nm.STEP_RE.match(n)),
    nm.is_dataloader: lambda n: n.startswith(nm.DATALOADER_PREFIX),
    nm.is_sync_call: lambda n: n in nm.SYNC_CALLS,
    nm.is_graph_launch: lambda n: n in nm.GRAPH_LAUNCH_CALLS,
    nm.is_stream_wait: lambda n: n in nm.STREAM_WAIT_CALLS,
    nm.is_nccl: lambda n: bool(nm.COLLECTIVE_RE.search(n)),
    nm.is_tensor_core: lambda n: bool(nm.TENSOR_CORE_RE.search(n)),
    nm.is_matmul: lambda n: bool(nm.MATMUL_RE.search(n)) and not nm.COLLECTIVE_RE.search(n),
    nm.is_training: lambda n: bool(nm.TRAINING_RE.search(n)),
    nm.is_fused_attention: lambda n: bool(nm.FUSED_ATTENTION_RE.search(n)),
    nm.is_softmax: lambda n: bool(nm.SOFTMAX_RE.search(n)) and not nm.FUSED_ATTENTION_RE.search(n),
    nm.is_elementwise: lambda n: (bool(nm.ELEMENTWISE_RE.search(n)) and not nm.INDUCTOR_FUSED_RE.match(n)
                                  and not nm.COLLECTIVE_RE.search(n)),
    nm.is_compile: lambda n: bool(nm.COMPILE_RE.search(n)) and not nm.NOT_COMPILE_RE.search(n),
    nm.is_comm_host: lambda n: bool(nm.COMM_HOST_RE.search(n)),
    nm.is_capture_call: lambda n: (n in nm.BEGIN_CAPTURE_CALLS or n in nm.END_CAPTURE_CALLS
                                   or bool(nm.GRAPH_INSTANTIATE_RE.match(n))),
    nm.is_capture_frame: lambda n: bool(nm.CAPTURE_FRAME_RE.search(n)),
    nm.is_cold_call: lambda n: bool(nm.COLD_CALL_RE.match(n)),
    nm.is_library_sync_op: lambda n: bool(nm.LIBRARY_SYNC_OP_RE.search(n)),
    nm.is_one_off_frame: lambda n: bool(nm.ONE_OFF_FRAME_RE.search(n)),
    nm.is_engine: lambda n: bool(nm.ENGINE_RE.search(n)),
    nm.is_library_matmul: lambda n: bool(nm.LIBRARY_MATMUL_RE.search(n)),
}

#: Names at the edges of the rewrites: anchors, word boundaries, look-behinds, case, line breaks.
EDGES = ["Cijk_Ailk_Bljk", "xCijk_A", "a\nCijk_x", "bmm_kernel", "xbmm", "_bmm", "at::bmm", "bn_fw_tr_1C11",
         "xbn_fw", "a bn_bw", "my_add_kernel", "Add_kernel", "xadd_kernel", "_mul_kernel", "1where_kernel",
         "index_elementwise_kernel", "aindex_elementwise", "NCCLKERNEL_AllReduce", "FlashAttnFwd", "LAYERNORM",
         "ProfilerStep#12", "ProfilerStep#12\n", "x\nProfilerStep#3", "enumerate(DataLoader)#_Iter", "\nenumerate(DataLoader)",
         "cudaMemcpy", "cudaMemcpy\n", "triton_poi_fused_add_kernel", "triton_per_fused_softmax", "İNCCL",
         "ﬀgemm", "\u212aernel_nccl", "convert_frame.py\n_compile", "torch/_inductor/x compile", "", "\n", "\n\n",
         "record_param_comms", "xrecord_param_comms", "record_param_comms\n", "c10d::allreduce_", "a c10d::x", "nccl:all_reduce",
         "cudaStreamBeginCapture", "cudaGraphInstantiateWithFlags", "xcudaGraphInstantiate", "capture_12_x", "a capture_1",
         "torch/cuda/graphs.py(12): capture_begin", "cudaLaunchKernel", "cudaLaunchKernelx", "aten::empty", "aten::empty_",
         "aten::cudnn_convolution", "vllm/worker.py", "avllm/", "execute_model_1", "ck_tile::x", "xck_", "void volta_sgemm_128x64_nn",
         "Void Sgemm_x", "MATMUL_OGS", "Optimizer.step#AdamW.step", "triton_poi_fused_backward", "DGRAD", "a\nb_backward",
         "entire_frame_compile", "xentire_frame_compile", "_compile.compile_inner (dynamo_timed)"]


#: Traces whose names the others already hold (same models, same libraries), left out to keep the test quick.
SAME_NAMES = {"v100_large_216k_events.json.gz", "resnet50_v100_workers4.json.gz", "v100_resnet_ns_timestamps.json.gz"}


def fixture_names() -> list[str]:
    names: list[str] = []
    for path in sorted(glob.glob(os.path.join(DATA, "*.json.gz"))):
        if os.path.basename(path) not in SAME_NAMES:
            names += load(path).names
    return list(dict.fromkeys(names + EDGES))


@pytest.fixture(scope="module")
def all_names():
    return fixture_names()


@pytest.mark.parametrize("classify", list(REFERENCE), ids=lambda f: f.__name__)
def test_one_name_and_all_names_agree_with_the_tables(classify, all_names):
    reference = np.array([REFERENCE[classify](n) for n in all_names])
    one_by_one = np.array([bool(classify(n)) for n in all_names])
    at_once = classify.batch(all_names)
    assert [all_names[i] for i in np.nonzero(one_by_one != reference)[0]] == []
    assert [all_names[i] for i in np.nonzero(at_once != reference)[0]] == []
    assert at_once.dtype == bool and len(at_once) == len(all_names)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("abcdegiklmnorstwx_ACIKNRS#()\n 0123456789:.μİ")), max_size=24),
                max_size=12))
def test_random_names_agree(names):
    names = list(names)
    for classify, reference in REFERENCE.items():
        want = [reference(n) for n in names]
        assert [bool(classify(n)) for n in names] == want, classify.__name__
        assert classify.batch(names).tolist() == want, classify.__name__


def test_a_name_past_the_limit_is_classified_on_its_beginning_with_a_note():
    head = "void cutlass_80_tensorop_s1688gemm_"
    long = head + "x" * (nm.MAX_NAME_CHARS + 10) + "nccl"
    assert nm.is_matmul(long) and nm.is_tensor_core(long)
    assert not nm.is_nccl(long)  # past the limit: not read
    assert nm.is_matmul.batch([long, "k"]).tolist() == [True, False]
    tb = TraceBuilder()
    busy_steps(tb, 6, 1000.0, 400.0, kernel_name=long)
    report = analyze(tb.to_dict())
    assert any(f"longer than {nm.MAX_NAME_CHARS:,} characters" in n for n in report.notes), report.notes
    plain = TraceBuilder()
    busy_steps(plain, 6, 1000.0, 400.0)
    assert not any("characters" in n for n in analyze(plain.to_dict()).notes)


def test_host_classes_are_read_on_the_names_host_events_carry():
    """``Context``'s host classes (calls, operators, frames) are evaluated on the names that some
    event other than a kernel, copy or memset carries, and are False on the others: every use of
    them selects host events, and a trace can hold hundreds of thousands of distinct kernel names."""
    from gpumagic.analysis.context import build_context, host_names

    tb = TraceBuilder()
    busy_steps(tb, 4, 1000.0, 400.0, kernel_name="capture_7")  # a kernel spelled like a host annotation
    trace = load(tb.to_dict())
    ctx = build_context(trace)
    host = host_names(trace)
    k = trace.names.index("capture_7")
    assert not host[k] and not ctx.masks["name_capture_frame"][trace.events.name == k].any()
    want = np.array([nm.is_capture_frame(n) for n in trace.names])
    assert (ctx.host_name_ids(nm.is_capture_frame) == (want & host)).all()
    for flag, classify in (("cold_call", nm.is_cold_call), ("step", nm.is_step), ("library_sync_op", nm.is_library_sync_op)):
        assert (nm.classify(trace.names, classify, host)[host] == np.array([classify(n) for n in trace.names])[host]).all(), flag


def test_kernel_classes_skip_only_names_without_their_text():
    """The kernel classes run only over the names holding a piece of some alternative's required
    text (the rarest two letters of it): every alternative has such text, and a name holding it
    is scanned."""
    assert nm._KERNEL_LITERALS is not None and all(len(x) >= 2 for x in nm._KERNEL_LITERALS)
    names = [f"void distinct_kernel_{i}<float, {i % 7}>(float*, int)" for i in range(2000)]
    names[500] = "void distinct_kernel_500<float>(Gemm*)"
    names[1500] = "ncclKernel_AllReduce_RING_LL_Sum_float(x)"
    assert nm.is_matmul.batch(names).nonzero()[0].tolist() == [500]
    assert nm.is_nccl.batch(names).nonzero()[0].tolist() == [1500]
    assert nm.is_training.batch(names).sum() == 0 and nm.is_tensor_core.batch(names).sum() == 0


def test_deferred_patterns_read_as_the_compiled_tables():
    """The patterns compiled on first use (``names._DEFERRED``) read as compiled patterns of their
    declared text and flags, by attribute and by ``from ... import``; an unknown name is still an
    AttributeError."""
    import re

    from gpumagic.analysis.names import COMPILE_RE

    assert COMPILE_RE is nm.COMPILE_RE
    for name, (text, flags) in nm._DEFERRED.items():
        p = getattr(nm, name)
        assert isinstance(p, re.Pattern) and p is getattr(nm, name)
        assert (p.pattern, p.flags) == (text, re.compile(text, flags).flags), name
    assert nm.COLLECTIVE_RE.flags & re.IGNORECASE and nm.is_step("ProfilerStep#3") and not nm.is_step("x\nProfilerStep#3")
    with pytest.raises(AttributeError, match="no attribute 'NOPE_RE'"):
        nm.NOPE_RE  # noqa: B018


def test_analysing_a_trace_compiles_none_of_the_deferred_patterns():
    """Classifying a trace's names runs the all-names twins only (multi-line, lower-cased), so the
    one-name patterns and the case-insensitive originals stay uncompiled (``gpumagic analyze``'s
    start-up: compiling them all took some milliseconds). The bundled example has device
    properties, so the architecture-from-kernel-names pattern is not needed either."""
    import subprocess
    import sys

    code = ("import gpumagic; from gpumagic.analysis import names as nm; gpumagic.analyze('example').to_json(); "
            "print(sorted(k for k in nm._DEFERRED if k in vars(nm)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
