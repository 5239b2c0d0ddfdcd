"""Level ``steps`` under the real ``Scheduler``: one hook per step, the step's batch read from
``get_next_batch_to_run``'s ``last_batch`` (a stand-in with the real method's parameters; the
real Scheduler cannot be built here without the serving stack)."""

from __future__ import annotations

import types

import tracer
from tests.sglang.hooks_util import rows
from tracer.sglang.hooks import scheduler as sched_hooks
from tracer.sglang.runtime import sampler
from tracer.sglang.runtime.state import S


class _FM:
    """A ``ForwardMode`` stand-in: the four predicates the sampler asks, in sglang's order."""

    def __init__(self, name):
        self.name = name

    def is_idle(self):
        return self.name == "IDLE"

    def is_mixed(self):
        return self.name == "MIXED"

    def is_decode(self):
        return self.name == "DECODE"

    def is_extend(self):
        return self.name in ("EXTEND", "MIXED")


EXTEND, DECODE = _FM("EXTEND"), _FM("DECODE")


def _batch(fm, n, extend_tokens=None):
    return types.SimpleNamespace(forward_mode=fm, reqs=[object()] * n, extend_num_tokens=extend_tokens)


def test_the_boundary_reads_the_batch_that_ran_from_last_batch(tmp_path):
    def get_next_batch_to_run(self, running_batch, last_batch):
        return "plan"

    wrapped = sched_hooks._make_get_next_batch()(get_next_batch_to_run)
    assert wrapped.__code__.co_varnames[:3] == ("self", "running_batch", "last_batch")  # exact
    sched = types.SimpleNamespace(forward_ct=0, tree_cache=None, token_to_kv_pool_allocator=None)
    plan = [None, _batch(EXTEND, 2, 300), _batch(DECODE, 2), _batch(DECODE, 3), None]
    tracer.start(tmp_path / "t", source="sglang-hooks", detail="steps")
    try:
        for ct, last in enumerate(plan):
            sched.forward_ct = ct
            S.dirty = False
            assert wrapped(sched, running_batch=None, last_batch=last) == "plan"
    finally:
        tracer.stop()
        sampler.loop.__init__()
    steps = [(r["forward_ct"], r["mode"], r["batch_size"], r["num_tokens"])
             for r in rows(tmp_path / "t", "sched") if r["kind"] == "step"]
    # the first boundary opens the first step; an idle step after a busy one is written once
    assert steps == [(1, "prefill", 2, 300), (2, "decode", 2, 2), (3, "decode", 3, 3), (4, "idle", 0, 0)]


def test_a_noted_batch_wins_over_last_batch(tmp_path):
    """At ``counts`` the ``prepare_for_*`` hooks note the batch (decode rows need them anyway)."""
    def get_next_batch_to_run(self, running_batch, last_batch):
        return None

    wrapped = sched_hooks._make_get_next_batch()(get_next_batch_to_run)
    sched = types.SimpleNamespace(forward_ct=0, tree_cache=None, token_to_kv_pool_allocator=None)
    tracer.start(tmp_path / "t", source="sglang-hooks")
    try:
        wrapped(sched, None, None)
        sampler.loop.note_batch(int(tracer.Mode.DECODE), 8, 8)
        sched.forward_ct = 1
        wrapped(sched, None, _batch(DECODE, 3))
    finally:
        tracer.stop()
        sampler.loop.__init__()
    steps = [(r["mode"], r["batch_size"]) for r in rows(tmp_path / "t", "sched") if r["kind"] == "step"]
    assert steps == [("decode", 8)]
