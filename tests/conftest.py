"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_recorder_leak():
    """Every test leaves the process-wide recorder stopped."""
    yield
    import tracer

    tracer.stop()


# Hypothesis: CI runs a fixed, derandomized profile (a CI draw can be reproduced anywhere with
# HYPOTHESIS_PROFILE=ci); local runs draw fresh examples. Per-test ``@settings`` still set the
# example counts; a profile sets how they are drawn.
def _register_hypothesis_profiles() -> None:
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
    settings.register_profile("dev", print_blob=True, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


_register_hypothesis_profiles()
