"""Eviction policy registry and rankings."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as N

import pytest

from replay.memory.policies import POLICIES, Registry


def nodes():
    return [
        N(name="a", last_access=5.0, creation_time=1.0, hit_count=3, priority=1),
        N(name="b", last_access=2.0, creation_time=4.0, hit_count=1, priority=2),
        N(name="c", last_access=9.0, creation_time=3.0, hit_count=1, priority=0),
    ]


@pytest.mark.parametrize(
    "name, order",
    [
        ("lru", "bac"),
        ("lfu", "bca"),
        ("fifo", "acb"),
        ("mru", "cab"),
        ("filo", "bca"),
        ("priority", "cab"),
    ],
)
def test_builtin_rankings(name, order):
    pol = POLICIES.create(name)
    got = "".join(n.name for n in sorted(nodes(), key=pol.priority))
    assert got == order


def test_bad_name_lists_known_ones():
    with pytest.raises(ValueError) as e:
        POLICIES.create("nope")
    for name in ("lru", "lfu", "fifo", "mru", "filo", "priority"):
        assert name in str(e.value)


def test_register_from_import_path():
    mod = types.ModuleType("kvtrace_test_policy_mod")

    class Oldest:
        def priority(self, node):
            return (node.creation_time,)

    mod.Oldest = Oldest
    sys.modules[mod.__name__] = mod
    reg = Registry()
    pol = reg.create("kvtrace_test_policy_mod:Oldest")
    assert isinstance(pol, Oldest)
    assert "kvtrace_test_policy_mod:Oldest" in reg.names()
    with pytest.raises(ValueError):
        reg.register_path("no_colon_here")


def test_duplicate_registration_is_rejected():
    reg = Registry()

    @reg.register("x")
    class A:
        def priority(self, node):
            return (0,)

    with pytest.raises(ValueError):

        @reg.register("x")
        class B:
            def priority(self, node):
                return (0,)
