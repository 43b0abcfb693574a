"""Shared test configuration: Hypothesis profiles (ci = derandomised, bounded)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("nightly", deadline=None, max_examples=2000)
settings.register_profile("dev", deadline=None, max_examples=30)
settings.load_profile(os.environ.get("QCONFORM_HYPOTHESIS_PROFILE", "ci"))
