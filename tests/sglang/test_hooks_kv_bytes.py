"""Bytes per token of the pools (``tracer.sglang.runtime.kv_bytes``) on the real sglang 0.5.23
classes, against what sglang itself reports for them: ``get_kv_size_bytes()`` (the K and V sizes
of its "KV Cache is allocated ... K size, V size" log line), ``mem_usage`` (GB, 2^30) and the
HiCache host pool's ``size_per_token`` × ``size`` (its "Allocating ... GB host memory" line)."""

from __future__ import annotations

import json

import pytest

from tests.sglang.hooks_fixtures import recording, runtime

pytestmark = pytest.mark.sglang

SWA_HOST = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=1024, swa_pool_tokens=512,
                max_running_requests=4, host_pool_tokens=2048)


def _rank_entry(path) -> dict:
    return json.loads(next((path / "ranks").glob("rank=*.json")).read_text())


def test_capture_records_the_bytes_sglang_reports_for_its_pools(tmp_path):
    from tracer.sglang.runtime import kv_bytes

    kv_bytes.reset()
    with recording(tmp_path / "t") as path, runtime(**SWA_HOST) as rt:
        rt.stats_observer.get_pool_stats()  # a loop boundary: the hooks adopt the pools
        kv = rt.kv_pool
        k, v = kv.get_kv_size_bytes()
        host = rt.host_pools
        sglang_says = {
            "full": sum(kv.full_kv_pool.get_kv_size_bytes()), "swa": sum(kv.swa_kv_pool.get_kv_size_bytes()),
            "mem_usage_gb": {"full": kv.full_kv_pool.mem_usage, "swa": kv.swa_kv_pool.mem_usage},
            "host": {name: (hp.size_per_token, hp.size) for name, hp in host.items()},
        }
    import tracer.sglang as hooks

    assert dict(hooks.failures) == {}
    got = _rank_entry(path)["kv_bytes"]
    pools = got["pools"]
    assert got["kv_pool"] == "SWAKVPool"
    assert set(pools) == {"full", "swa", "host_full", "host_swa"}
    for name in ("full", "swa"):
        p = pools[name]
        assert p["allocated_bytes"] == sglang_says[name] == p["server_kv_size_bytes"]
        # sglang's buffers have size + page_size token rows (the padding page)
        assert p["bytes_per_token"] * (p["tokens"] + p["page_size"]) == p["allocated_bytes"]
        assert p["server_mem_usage_gb"] == pytest.approx(sglang_says["mem_usage_gb"][name])
        assert p["allocated_bytes"] / 2**30 == pytest.approx(p["server_mem_usage_gb"])
    assert pools["full"]["allocated_bytes"] + pools["swa"]["allocated_bytes"] == k + v
    for name, host_name in (("full", "host_full"), ("swa", "host_swa")):
        spt, size = sglang_says["host"][name]
        hp = pools[host_name]
        assert hp["bytes_per_token"] == spt and hp["tokens"] == size
        assert hp["allocated_bytes"] == spt * size  # sglang's requested_bytes
        # a host pool stores a device token's bytes
        assert hp["bytes_per_token"] == pools[name]["bytes_per_token"]


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float8_e4m3fn"])
def test_realistic_pools_match_sglang_and_the_presets_formula(dtype_name):
    """Pools with a real model's shape (8 KV heads of 128, 4 layers; a hybrid 3 sliding + 1 full)
    on CPU: bytes per token equal sglang's own sizes and ``replay.models``' cell formula."""
    from replay.backends.sglang.env import bootstrap

    bootstrap()
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    from replay.models import mha_bytes_per_token
    from tracer.sglang.runtime.kv_bytes import device_pools

    dtype = getattr(torch, dtype_name)
    item = torch.empty(0, dtype=dtype).element_size()
    p = MHATokenToKVPool(size=2048, page_size=16, dtype=dtype, head_num=8, head_dim=128, layer_num=4,
                         device="cpu", enable_memory_saver=False)
    full = device_pools(p)["full"]
    assert full["bytes_per_token"] == mha_bytes_per_token(layers=4, kv_heads=8, head_dim=128, dtype_bytes=item)
    assert full["allocated_bytes"] == sum(p.get_kv_size_bytes())
    s = SWAKVPool(size=2048, size_swa=512, page_size=16, dtype=dtype, head_num=4, head_dim=64,
                  swa_attention_layer_ids=[0, 1, 2], full_attention_layer_ids=[3], device="cpu")
    got = device_pools(s)
    assert got["full"]["bytes_per_token"] == mha_bytes_per_token(layers=1, kv_heads=4, head_dim=64,
                                                                 dtype_bytes=item)
    assert got["swa"]["bytes_per_token"] == mha_bytes_per_token(layers=3, kv_heads=4, head_dim=64,
                                                                dtype_bytes=item)
    assert got["full"]["allocated_bytes"] + got["swa"]["allocated_bytes"] == sum(s.get_kv_size_bytes())
    assert got["full"]["allocated_bytes"] + got["swa"]["allocated_bytes"] == pytest.approx(s.mem_usage * 2**30)
