"""Bytes per token on the fork's DeepSeek-V4 stack (``tracer.sglang.hooks.fork.dsv4.pool_bytes``):
the rank entry's ``kv_bytes`` against the fork's own sizing, in one fork process (post659).

The pools are built by the fork's configurator path (``replay.backends.fork.dsv4_pools``:
``DSV4PoolConfigurator`` → ``_init_pools``) while a recording runs with the fork hooks installed;
the allocator's constructor hook writes the entry. Checked: full + ratio × swa equals the
configurator's ``bytes_per_full_token`` (the coefficient the fork divides the memory budget by);
each pool's ``allocated_bytes`` equals the bytes its tensors hold, counted here independently;
the preset ``dsv4-tiny`` (``replay.models``) gives the same figures. A second fork process runs
the DSV4 HiCache stack (the fork's Scheduler, one request) for the host pools' bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HOOKED = ("sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.swa_memory_pool",
          "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.memory_pool_host",
          "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.common",
          "sglang.srt.managers.schedule_policy", "sglang.srt.managers.schedule_batch",
          "sglang.srt.managers.scheduler")


def measure(out_dir: str, model_dir: str) -> dict:
    """(In the fork's process.) Build the DSV4 pools while recording; return the rank entry's
    ``kv_bytes``, the configurator's coefficient and the tensors' bytes (JSON)."""
    import importlib

    import tracer
    from replay.backends.fork import dsv4_pools
    from tracer.sglang.hooks import fork
    from tracer.sglang.patching import Patcher
    from tracer.sglang.runtime import kv_bytes, state

    for m in HOOKED:
        importlib.import_module(m)
    state.reset()
    kv_bytes.reset()
    p = Patcher()
    fork.install(p, lazy=False, level="counts")
    dsv4_pools.write_model_dir(model_dir, "dsv4")
    args = dsv4_pools.make_server_args(model_dir)
    tracer.start(out_dir, source="fork-kv-bytes-test")
    try:
        runner = dsv4_pools.build_runner(args)
    finally:
        tracer.stop()
        p.restore()
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    conf = create_memory_pool_configurator(runner)
    kv = runner.token_to_kv_pool

    def nb(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    states = [s.kv_score_buffer.kv_score for s in kv.compress_state_pools if s is not None]
    ratios = [s.ratio for s in kv.compress_state_pools if s is not None]
    istates = [s.kv_score_buffer.kv_score for s in kv.indexer_compress_state_pools if s is not None]
    full_t = (nb(kv.c4_kv_pool.kv_buffer) + nb(kv.c128_kv_pool.kv_buffer)
              + nb(kv.c4_indexer_kv_pool.index_k_with_scale_buffer)
              + nb([t for t, r in zip(states, ratios) if r == 128]))
    swa_t = nb(kv.swa_kv_pool.kv_buffer) + nb([t for t, r in zip(states, ratios) if r == 4]) + nb(istates)
    rank = json.loads(next((Path(out_dir) / "ranks").glob("rank=*.json")).read_text())
    return {"kv_bytes": rank.get("kv_bytes"), "failures": dict(state.failures),
            "bytes_per_full_token": float(conf.bytes_per_full_token), "ratio": float(args.swa_full_tokens_ratio),
            "tensor_bytes": {"full": int(full_t), "swa": int(swa_t)},
            "sizes": {"full": int(runner.token_to_kv_pool_allocator.size_full),
                      "swa": int(runner.token_to_kv_pool_allocator.size_swa)}}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dsv4_bytes_per_token_equal_the_forks_sizing(fork_codes, tmp_path):
    from replay.codes import call_in_code
    from replay.models import preset

    got = call_in_code(fork_codes["post659"], "tests.fork.test_fork_kv_bytes:measure",
                       {"out_dir": str(tmp_path / "trace"), "model_dir": str(tmp_path / "model")}).result
    assert got["failures"] == {}, got["failures"]
    kb = got["kv_bytes"]
    assert kb and kb["kv_pool"] == "DeepSeekV4TokenToKVPool", kb
    full, swa = kb["pools"]["full"], kb["pools"]["swa"]
    assert full["method"] == swa["method"] == "dsv4"
    assert full["tokens"] == got["sizes"]["full"] and swa["tokens"] == got["sizes"]["swa"]
    # the fork's own coefficient: tokens = available bytes / bytes_per_full_token
    assert full["bytes_per_token"] + got["ratio"] * swa["bytes_per_token"] == pytest.approx(
        got["bytes_per_full_token"], rel=1e-12)
    assert full["allocated_bytes"] == got["tensor_bytes"]["full"]
    assert swa["allocated_bytes"] == got["tensor_bytes"]["swa"]
    # the tensors hold a little more than the coefficient (576-byte page padding, padding page, rings)
    assert full["bytes_per_token"] <= full["allocated_bytes_per_token"] <= 1.1 * full["bytes_per_token"]
    assert swa["bytes_per_token"] <= swa["allocated_bytes_per_token"] <= 1.5 * swa["bytes_per_token"]
    tiny = preset("dsv4-tiny")
    assert tiny.bytes_per_token["full"] == pytest.approx(full["bytes_per_token"], rel=1e-12)
    assert tiny.bytes_per_token["swa"] == pytest.approx(swa["bytes_per_token"], rel=1e-12)


def capture_small(out_dir: str) -> dict:
    """(In the fork's process.) ``test_fork_dsv4_replay.capture`` (the DSV4 HiCache stack as a server
    records it) with one short request: the pools are what this test reads, not the traffic."""
    from tests.fork import test_fork_dsv4_replay as base

    base._requests = lambda: [{"rid": "one", "input_len": 300, "max_new_tokens": 4, "arrival_step": 0}]
    return base.capture(out_dir)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dsv4_hicache_host_bytes_are_the_side_pools_buffers(fork_codes, tmp_path):
    """The DSV4 HiCache stack of ``test_fork_dsv4_replay`` (one fork process, one request): the host
    pools' bytes are the side pools' buffers (the ``kv`` entry is the logical anchor, no tensor) over the
    anchor's tokens, as the stats rows count them (126 host pages, 11 SWA host pages)."""
    from replay.codes import call_in_code
    from tests.fork.test_fork_dsv4_replay import PS
    from tests.sglang.hooks_util import rows

    cap = tmp_path / "capture"
    got = call_in_code(fork_codes["post659"], "tests.fork.test_fork_kv_bytes:capture_small",
                       {"out_dir": str(cap)}, timeout_s=540).result
    assert got["failures"] == {}, got["failures"]
    pools = json.loads(next((cap / "ranks").glob("rank=*.json")).read_text())["kv_bytes"]["pools"]
    caps = {r["pool"]: int(r["capacity"]) for r in rows(cap, "stats")}
    assert pools["host_full"]["tokens"] == caps["host_full"] == 126 * PS
    assert pools["host_swa"]["tokens"] == caps["host_swa"] == 11 * PS
    for name, parts in (("host_full", {"kv", "deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128"}),
                        ("host_swa", {"swa", "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state"})):
        p = pools[name]
        assert set(p["parts"]) == parts and p["method"] == "host_buffers"
        assert p["allocated_bytes"] == sum(x["allocated_bytes"] for x in p["parts"].values())
        assert p["bytes_per_token"] == p["allocated_bytes"] / p["tokens"]
    assert pools["host_full"]["parts"]["kv"]["allocated_bytes"] == 0  # LogicalHostPool: no tensor
    # the SWA host pool: one padded SWA page per layer and host page (layer_first)
    swa = pools["host_swa"]["parts"]["swa"]
    assert swa["allocated_bytes"] == pools["swa"]["layers"] * 11 * swa["size_per_token"]
