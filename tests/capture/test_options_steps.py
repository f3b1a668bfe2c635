"""Options validation and the step window's pure state machine."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumagic.capture.errors import CaptureError, OptionsError
from gpumagic.capture.options import DEFAULT_MAX_SECONDS, CaptureOptions
from gpumagic.capture.steps import StepAction, marker_name, step_action


@pytest.mark.parametrize("kwargs, fragment", [
    ({"skip": -1}, "skip must be an integer >= 0"),
    ({"steps": 0}, "steps must be an integer >= 1"),
    ({"accumulation_steps": 0}, "accumulation_steps must be an integer >= 1"),
    ({"steps": 2.5}, "steps must be an integer"),
    ({"skip": True}, "skip must be an integer"),
    ({"interval_ms": 5}, "interval_ms must be an integer >= 10"),
    ({"max_seconds": 0}, "max_seconds must be a positive number"),
    ({"max_seconds": math.inf}, "max_seconds must be a positive number"),
    ({"max_seconds": "3"}, "max_seconds must be a positive number"),
    ({"label": 3}, "label must be a string"),
])
def test_bad_options_raise_one_sentence(kwargs, fragment):
    with pytest.raises(OptionsError, match=fragment) as info:
        CaptureOptions(**kwargs)
    assert isinstance(info.value, (ValueError, CaptureError))
    assert "\n" not in str(info.value)


def test_defaults_skip_one_record_five_with_a_cap():
    opts = CaptureOptions()
    assert (opts.first_recorded_step, opts.last_recorded_step) == (1, 6)
    assert opts.cap_seconds == DEFAULT_MAX_SECONDS


def test_all_steps_records_from_the_start_without_limit_or_cap():
    opts = CaptureOptions(all_steps=True, skip=3, steps=2)
    assert (opts.first_recorded_step, opts.last_recorded_step, opts.cap_seconds) == (0, None, None)
    assert CaptureOptions(all_steps=True, max_seconds=2).cap_seconds == 2.0


def test_describe_reports_the_effective_window():
    d = CaptureOptions(skip=2, steps=3, shapes=True).describe()
    assert (d["skip"], d["steps"], d["record_shapes"], d["with_stack"]) == (2, 3, True, False)
    d = CaptureOptions(flops=True).describe()
    assert (d["record_shapes"], d["with_flops"]) == (True, True)  # FLOP counts need the shapes
    d = CaptureOptions(batch_size=8, accumulation_steps=4).describe()
    assert (d["batch_size"], d["accumulation_steps"]) == (8, 4)  # what the energy per sample reads


def test_default_window_actions():
    actions = [step_action(c, 1, 6) for c in range(9)]
    assert actions == [StepAction.NOTHING, StepAction.BEGIN] + [StepAction.ADVANCE] * 4 + [
        StepAction.STOP, StepAction.NOTHING, StepAction.NOTHING]


def test_unbounded_window_never_stops():
    assert [step_action(c, 0, None) for c in range(4)] == [StepAction.BEGIN] + [StepAction.ADVANCE] * 3


@given(first=st.integers(0, 20), count=st.integers(1, 20), extra=st.integers(0, 20))
def test_window_opens_once_records_count_steps_and_stops_once(first, count, extra):
    actions = [step_action(c, first, first + count) for c in range(first + count + extra + 1)]
    assert actions.count(StepAction.BEGIN) == 1
    assert actions.count(StepAction.STOP) == 1
    # markers opened (BEGIN + ADVANCE) equal the steps recorded, each closed by the next or by STOP
    assert actions.count(StepAction.BEGIN) + actions.count(StepAction.ADVANCE) == count
    assert actions.index(StepAction.BEGIN) == first


def test_marker_names_are_torchs():
    assert marker_name(3) == "ProfilerStep#3"


def test_the_magic_passes_batch_size_and_accumulation_steps_to_the_capture():
    from IPython.core.magic_arguments import parse_argstring

    from gpumagic.shells.magic import GpuProfileMagics, _capture_options

    options = _capture_options(parse_argstring(GpuProfileMagics.gpuprofile, "--batch-size 8 --accumulation-steps 4"))
    assert (options.batch_size, options.accumulation_steps) == (8, 4)
    assert _capture_options(parse_argstring(GpuProfileMagics.gpuprofile, "")).accumulation_steps == 1
