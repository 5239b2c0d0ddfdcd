"""DeepSeek-V4 sizing without the fork: the fork's host formula restated (``replay.backends.dsv4``),
the ratio that rebuilds recorded host sizes, the reference backend's DSV4 capacities and budgets,
and the refusals (no fork process; the fork's runs are in ``test_dsv4_backends`` and
``tests/fork/test_fork_dsv4_replay.py``)."""

from __future__ import annotations

import pytest

from replay.backends import dsv4


def _fork_host_pages(device_pages: int, ratio: float) -> int:
    # hybrid_pool_assembler._deepseek_v4_num_host_pages, as the fork writes it
    return max(int(device_pages * ratio), device_pages + 1)


@pytest.mark.parametrize("full_pages", [20, 41, 47, 58, 69, 75, 128])
def test_the_ratio_rebuilds_every_host_size_the_fork_makes(full_pages):
    full = full_pages * 256
    dev_full, swa = dsv4.device_pool_tokens(full, 0.1)
    swa_pages = swa // 256
    naive_off = 0
    for r100 in range(101, 400, 7):
        ratio = r100 / 100
        want = (_fork_host_pages(full_pages, ratio) * 256, _fork_host_pages(swa_pages, ratio) * 256)
        assert dsv4.host_pool_tokens(dev_full, swa, ratio) == want
        got = dsv4.host_pool_tokens(dev_full, swa, dsv4.hicache_ratio_for(dev_full, swa, *want))
        assert got == want, (ratio, got, want)
        naive = dsv4.host_pool_tokens(dev_full, swa, want[0] / full)
        naive_off += naive != want
    if full_pages in (47, 69):  # the sizes the fork tests use: host / full as a ratio is a page off
        assert naive_off > 0


def test_reference_settings_size_dsv4_host_pools_as_the_fork():
    from replay.backends.reference.settings import ReferenceSettings

    kw = dict(page_size=256, sliding_window_tokens=128, full_pool_tokens=69 * 256, swa_full_tokens_ratio=0.1,
              host_pool_tokens=126 * 256)
    d = ReferenceSettings(**kw, kv_stack="dsv4", host_swa_pool_tokens=11 * 256).memory_config()
    assert (d.swa_pool_tokens, d.host_pool_tokens, d.swa_host_pool_tokens) == (1536, 126 * 256, 11 * 256)
    # ratio 2 on 48 pages (4 SWA pages): the fork's 96 and 8 pages; the generic sizing (device
    # times ratio plus a padding page) gives one page more each
    kw |= {"host_pool_tokens": 96 * 256, "full_pool_tokens": 48 * 256}
    d = ReferenceSettings(**kw, kv_stack="dsv4").memory_config()
    generic = ReferenceSettings(**kw).memory_config()
    assert (d.host_pool_tokens, d.swa_host_pool_tokens) == (96 * 256, 8 * 256)
    assert (generic.host_pool_tokens, generic.swa_host_pool_tokens) == (97 * 256, 9 * 256)


def test_dsv4_refusals_name_what_is_wrong():
    from replay import knobs
    from replay.backends.reference.settings import ReferenceSettings
    from replay.backends.sglang.settings import SglangSettings

    with pytest.raises(ValueError, match="kv_stack=dsv4 cannot be expressed by the sglang backend"):
        SglangSettings(page_size=256, full_pool_tokens=16384, kv_stack="dsv4")
    with pytest.raises(ValueError, match="page_size=64 with kv_stack=dsv4: DeepSeek-V4 pages are 256 tokens"):
        ReferenceSettings(page_size=64, full_pool_tokens=16384, kv_stack="dsv4")
    with pytest.raises(ValueError, match="host_swa_pool_tokens=512 is taken with kv_stack=dsv4 only"):
        ReferenceSettings(host_pool_tokens=4096, host_swa_pool_tokens=512)
    assert knobs.knob("kv_stack").default == "generic"


def test_the_dsv4_swa_budget_reserves_the_whole_window():
    from replay.backends.reference.budget import swa_need_tokens

    # 0.5.23: min(extend + max_new, W); the fork's _swa_budget_for_req: W whatever the output
    assert swa_need_tokens(256, 8, 128, 256) == 128 + 128 + 256
    assert swa_need_tokens(0, 8, 128, 256) == 8 + 256
    assert swa_need_tokens(0, 8, 128, 256, dsv4=True) == 128 + 256


def test_a_workload_is_no_dsv4_trace(tmp_path):
    from replay.backends.sglang.workload import write_workload
    from tracer.schema.manifest import read_manifest

    write_workload(tmp_path / "wl", [dict(rid=0, ts_ns=0, input_len=10, page_hashes=[1], max_new_tokens=2,
                                          output_len=2)], hash_block_tokens=16)
    m = read_manifest(tmp_path / "wl")
    assert not dsv4.is_dsv4(tmp_path / "wl", m)
    assert "kv_stack" not in dsv4.recorded_settings(tmp_path / "wl", m)
