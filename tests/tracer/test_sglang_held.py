"""The stats sampler's inlined request-private SWA formula (``sampler.held_tokens``) equals
sglang's own ``kv_private_swa_tokens`` on real ``ReqKvInfo`` records, and is used only while
sglang's helpers are the ones it restates."""

from __future__ import annotations

import random
import types

import pytest

from tracer.sglang.runtime import held, sampler, state


@pytest.fixture()
def sglang_swa():
    from replay.backends.sglang.env import bootstrap

    bootstrap()
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.managers.scheduler_components import pool_stats_observer as pso

    saved = dict(sampler.helpers)
    sampler.helpers.update(swa=pso.kv_private_swa_tokens, swa_ct=pso.ComponentType.SWA)
    held._swa_inline.clear()
    yield ReqKvInfo, pso
    sampler.helpers.clear()
    sampler.helpers.update(saved)
    held._swa_inline.clear()
    state.registry.live_reqs.clear()


def _kv(ReqKvInfo, ct, rng):
    kv = ReqKvInfo()
    kv.req_pool_idx = rng.randrange(8)
    kv.cache_protected_len = rng.randrange(0, 400)
    kv.kv_allocated_len = kv.cache_protected_len + rng.randrange(0, 900)
    kv.swa_evict_floor = rng.choice([0, rng.randrange(0, 600)])
    if rng.random() < 0.7:
        kv.component_evicted_seqlens[ct] = rng.randrange(0, kv.kv_allocated_len + 1)
    return kv


@pytest.mark.parametrize("ps", [1, 16, 64])
def test_inlined_swa_held_equals_sglangs_helper(sglang_swa, ps):
    ReqKvInfo, pso = sglang_swa
    rng = random.Random(ps)
    ct = pso.ComponentType.SWA
    kvs = [_kv(ReqKvInfo, ct, rng) for _ in range(300)]
    state.registry.live_reqs.clear()
    for i, kv in enumerate(kvs):
        state.registry.live_reqs[i] = types.SimpleNamespace(kv=kv)
    full, swa = sampler.held_tokens(None, ps, True)
    assert sampler.swa_inline_ok(kvs[0])  # the inlined path ran
    assert full == sum(pso.kv_private_tokens(kv, ps) for kv in kvs)
    assert swa == sum(pso.kv_private_swa_tokens(kv, ps) for kv in kvs)


def test_a_changed_helper_falls_back_to_calling_it(sglang_swa):
    ReqKvInfo, pso = sglang_swa
    calls = []

    def other(kv, ps):  # not sglang's source: the sampler must call it
        calls.append(kv)
        return 7

    sampler.helpers["swa"] = other
    kv = _kv(ReqKvInfo, pso.ComponentType.SWA, random.Random(1))
    kv.component_evicted_seqlens[pso.ComponentType.SWA] = 5
    state.registry.live_reqs[0] = types.SimpleNamespace(kv=kv)
    assert sampler.held_tokens(None, 16, True)[1] == 7
    assert calls == [kv] and not sampler.swa_inline_ok(kv)
