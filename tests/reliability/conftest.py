"""Hypothesis profiles for the trace fuzzer (tests/reliability/test_fuzz_traces.py).

``fuzz-ci`` (the default) keeps the fuzzer's share of a suite run to about a minute on the
2-core dev machine; ``fuzz-long`` runs on demand:
``GPUMAGIC_FUZZ=fuzz-long python -m pytest tests/reliability -q``. The profiles are applied
only to the fuzz tests (through :data:`FUZZ_PROFILE`), not to the rest of the suite.
"""

import os

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("fuzz-ci", max_examples=120, deadline=None, suppress_health_check=_SLOW_OK, derandomize=False)
settings.register_profile("fuzz-long", max_examples=3000, deadline=None, suppress_health_check=_SLOW_OK)

#: The profile the fuzz tests run under.
FUZZ_PROFILE = os.environ.get("GPUMAGIC_FUZZ", "fuzz-ci")
