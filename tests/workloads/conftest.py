"""Fixtures for workload tests: hand-written JSONL files and small generated workloads."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_path():
    return lambda name: FIXTURES / name


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """Generate (once per session) and read back small workloads: generated(shape, n, seed, **kw)."""
    from replay.workloads.generate import GenerateOptions, generate_workload
    from replay.workloads.io import read_workload

    cache = {}
    root = tmp_path_factory.mktemp("generated")

    def get(shape: str, n: int = 500, seed: int = 1, **kw):
        key = (shape, n, seed, tuple(sorted(kw.items())))
        if key not in cache:
            out = root / f"{shape}-{n}-{seed}-{len(cache)}"
            generate_workload(out, GenerateOptions(shape, n, seed=seed, **kw))
            cache[key] = read_workload(out)
        return cache[key]

    return get
