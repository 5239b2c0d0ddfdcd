"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

# the xdist work units of make test: a module or an xdist_group on one worker (see the module)
from tests.xdist_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401

__all__ = ["pytest_collection_modifyitems", "pytest_xdist_make_scheduler"]  # the hooks above, used by pytest


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


# A code's process (``replay.codes.call_in_code``) spends 20-45 s importing its sglang: the suite
# hands the calls of each xdist worker to warm parents that import once and fork a child per call
# (``replay.codes.warm``; tests/codes/test_warm.py checks a warm call is a cold one). A test that
# sets KVTRACE_CODE_WARM=0 runs its calls cold. A worker keeps 4 parents (~0.6 GB each), not 2:
# the fork's tests call each commit both bare and with a run's SGLANG_* environment (4 keys);
# with 2 kept they evicted each other (the fork units' 35 in-process calls, in one process: 9
# imports with 2 parents kept, 7 with 4). tests/xdist_groups.py puts those units on one worker
# (MERGED).
def _warm_code_processes() -> None:
    import os

    os.environ.setdefault("KVTRACE_CODE_WARM", "1")
    os.environ.setdefault("KVTRACE_CODE_WARM_MAX", "4")


_warm_code_processes()


# Bytecode: where PYTHONDONTWRITEBYTECODE is set (this CI's environment sets it), no process ever
# writes a .pyc, so every code process, server process and CLI call of the suite compiled what it
# imported again: the fork's unpacked sglang (.kvtrace-codes/ ships no .pyc) and this repository.
# The suite lets them be written (atomic per file, safe across the xdist workers; git-ignored),
# once per module instead of once per process: measured 58.3 -> 53.4 CPU s on
# tests/codes/test_warm.py (three imports of the fork's sglang).
def _write_bytecode() -> None:
    import os
    import sys

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_write_bytecode()
