"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_recorder_leak():
    """Every test leaves the process-wide recorder stopped."""
    yield
    import tracer

    tracer.stop()
