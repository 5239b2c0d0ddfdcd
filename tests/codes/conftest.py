"""Fixtures of the code tests: ``small_workload`` (tests/runs/conftest.py), for test_upstream_code.py."""

from __future__ import annotations

from tests.runs.conftest import small_workload

__all__ = ["small_workload"]  # the fixture, registered for this directory
