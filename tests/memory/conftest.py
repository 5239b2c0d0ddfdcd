"""Shared helpers for the memory-model tests."""

from __future__ import annotations

import pytest

from replay.memory import KVCacheModel, MemoryConfig


def seq(tag: int, n: int, start: int = 0) -> list[int]:
    """Page hashes of a synthetic sequence ``tag`` (distinct tags share nothing)."""
    return [tag * 1_000_003 + i for i in range(start, start + n)]


@pytest.fixture
def make_model():
    def _make(**kw) -> KVCacheModel:
        kw.setdefault("debug_check_every_op", True)
        return KVCacheModel(MemoryConfig(**kw))

    return _make
