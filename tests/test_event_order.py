"""A report does not depend on the order in which the file lists its events, nor on where its
clock starts: a trace merged or converted by another tool (which may sort events differently, or
rebase the timestamps) reads as the profiler's own file does.

One case is left to the file's order on purpose: two operators on one thread with the same start
and the same duration (a wrapper and the operator it calls, rounded to the same microseconds,
such as DDP's ``torch::distributed::reducer::mul_out`` and its ``aten::mul`` in the A100 rank).
Nothing in the events says which one encloses the other; the profiler writes the enclosing one
first, and the analysis keeps that order (tests on the real traces cover it). The traces below
have no such pair whose order changes an answer."""

import gzip
import json
import os
import random

import pytest
from recorded import analysed
from tracebuilder import DATA

from gpumagic.analysis import analyze
from gpumagic.trace.kineto import from_bytes

#: A Kineto 2021 training trace (its operators table has operators with equal GPU times, 0: they
#: launched nothing), an H100 and an MI300X inference step, a HIP graph replay, a multi-stream
#: CUDA trace, and a CPU training loop with loader workers.
TRACES = ["volta_resnet50_profiler_nw4", "h100_falconsai_infer", "mi300_bert_small_infer",
          "mi300_vllm_decode_fullgraph", "event_sync_multistream", "cpu_tensordataset_workers2"]


def _document(name: str) -> dict:
    with gzip.open(os.path.join(DATA, f"{name}.json.gz")) as fh:
        return json.load(fh)


def _comparable(report) -> tuple[dict, list]:
    data = report.to_dict()
    metrics = data["metrics"]
    metrics["trace"].pop("source")  # the file's name, which the rewritten text does not carry
    return metrics, data["findings"]


def _reanalysed(document: dict, name: str):
    return analyze(from_bytes(json.dumps(document).encode(), f"{name}.json"))


@pytest.mark.parametrize("order", ["shuffled", "reversed"])
@pytest.mark.parametrize("name", TRACES)
def test_the_events_order_in_the_file_changes_nothing(name, order):
    """Equal values (operators' GPU times, critical-path links' times) are ranked by name, not by
    where the file first named them."""
    document = _document(name)
    assert len(document["traceEvents"]) > 100
    if order == "shuffled":
        random.Random(7).shuffle(document["traceEvents"])
    else:
        document["traceEvents"].reverse()
    assert _comparable(_reanalysed(document, name)) == _comparable(analysed(name))


@pytest.mark.parametrize("name", TRACES)
def test_a_later_clock_changes_nothing(name):
    """Every timestamp one second later (an exact float shift): the times the report gives are
    relative to the trace, so they are the same."""
    document = _document(name)
    shifted = 0
    for event in document["traceEvents"]:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] += 1_000_000
            shifted += 1
    assert shifted > 100
    assert _comparable(_reanalysed(document, name)) == _comparable(analysed(name))
