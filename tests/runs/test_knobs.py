"""The one knob table and its presets (no sglang needed)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from replay import knobs
from replay.knobs import FIXES, PRESETS, KnobError


def _diff(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_presets_differ_by_exactly_the_fixes():
    assert _diff(PRESETS["baseline"], PRESETS["swa-fixes"]) == set(FIXES)
    for knob, (pre, post) in FIXES.items():
        assert _diff(PRESETS[f"baseline+{post}"], PRESETS["baseline"]) == {knob}
        assert PRESETS[f"baseline+{post}"][knob] == post
        assert _diff(PRESETS[f"swa-fixes-{post}"], PRESETS["swa-fixes"]) == {knob}
        assert PRESETS[f"swa-fixes-{post}"][knob] == pre
    assert _diff(PRESETS["eic"], PRESETS["swa-fixes"]) == {"prefix_ownership"}
    # #659 as the fork's post659 code does it (tests/claims/test_fork_659.py checks it on the code)
    assert PRESETS["fork-659"] == PRESETS["swa-fixes"] | {"swa_admission": "shrink_always",
                                                          "swa_out_of_window_release": "decode_only"}


def test_swa_fixes_is_the_default_behaviour():
    d = knobs.defaults()
    assert all(d[k] == v for k, v in PRESETS["swa-fixes"].items())


def test_every_design_knob_is_in_the_table_once():
    design = {"swa_lru_refresh", "swa_admission", "host_free", "swa_out_of_window_release",
              "swa_release_boundary", "prefix_ownership", "eviction_policy", "device_free", "page_size",
              "sliding_window_tokens", "full_pool_tokens", "swa_pool_tokens", "swa_full_tokens_ratio",
              "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "host_pool_tokens",
              "hicache_write_policy"}
    names = [k.name for k in knobs.KNOBS]
    assert len(names) == len(set(names))
    assert design <= set(names)
    assert "swa_free_out_of_window_at_insert" in knobs.ALIASES
    for k in knobs.KNOBS:
        if k.group == "policy":
            assert k.upstream and k.help and k.default in k.values


def test_parse_sets_and_errors():
    assert knobs.parse_sets(["page_size=64", "host-free=eager_cat", "swa_full_tokens_ratio=0.5",
                             "swa_free_out_of_window_at_insert=false", "full_pool_tokens=1_048_576"]) == {
        "page_size": 64, "host_free": "eager_cat", "swa_full_tokens_ratio": 0.5,
        "swa_out_of_window_release": "decode_only", "full_pool_tokens": 1048576}
    with pytest.raises(KnobError, match="valid knobs: swa_lru_refresh"):
        knobs.parse_sets(["pagesize=3"])
    with pytest.raises(KnobError, match="expected one of eager_cat, lazy_merge"):
        knobs.parse_sets(["host_free=lazy"])
    with pytest.raises(KnobError, match="expected a finite number"):
        knobs.parse_sets(["swa_full_tokens_ratio=inf"])
    with pytest.raises(KnobError, match="expected a number >= 1"):
        knobs.parse_sets(["page_size=0"])
    with pytest.raises(KnobError, match="expected key=value"):
        knobs.parse_sets(["page_size"])
    assert knobs.parse_sets(["eviction_policy=my.pkg:Policy"]) == {"eviction_policy": "my.pkg:Policy"}


@given(st.text(max_size=20))
def test_bad_values_raise_knob_errors_only(raw):
    for k in knobs.KNOBS:
        try:
            k.parse(raw)
        except KnobError:
            pass


def test_backend_refusals_name_the_backend_that_can():
    with pytest.raises(KnobError, match="prefix_ownership=eic_release_protected_prefix cannot be expressed "
                                        "by the sglang backend; use --backend reference"):
        knobs.check_backend(PRESETS["eic"], "sglang")
    with pytest.raises(KnobError, match="use --backend reference"):
        knobs.check_backend({"eviction_policy": "my.pkg:Policy"}, "sglang")
    with pytest.raises(KnobError, match="use --backend sglang"):
        knobs.check_backend({"eviction_policy": "slru"}, "reference")
    knobs.check_backend(PRESETS["eic"], "reference")


def test_resolve_over_recorded_settings_lists_what_was_assumed():
    manifest = {"server": {"page_size": 64, "sliding_window_tokens": 128, "full_pool_tokens": 65536,
                           "swa_pool_tokens": 16384, "chunked_prefill_size": 4096, "host_pool_tokens": 0,
                           "hicache_write_policy": "", "eviction_policy": "lfu", "model": "m"}}
    rec = knobs.recorded_settings(manifest)
    assert rec == {"page_size": 64, "sliding_window_tokens": 128, "full_pool_tokens": 65536,
                   "swa_pool_tokens": 16384, "chunked_prefill_size": 4096, "host_pool_tokens": 0,
                   "eviction_policy": "lfu"}
    values, assumed = knobs.resolve("baseline", ["page_size=16"], rec)
    assert values["page_size"] == 16 and values["full_pool_tokens"] == 65536
    assert values["host_free"] == "eager_cat" and values["eviction_policy"] == "lfu"
    assert "full_pool_tokens" not in assumed and "max_running_requests" in assumed
    assert "host_free" not in assumed and "step_fixed_ns" not in assumed
    # a run's manifest records every knob: replaying it under `recorded` repeats it
    run_manifest = {"server": {}, "run": {"settings": values}}
    assert knobs.resolve("recorded", (), knobs.recorded_settings(run_manifest))[0] == values
    with pytest.raises(KnobError, match="known presets: recorded, baseline, swa-fixes"):
        knobs.resolve("nope")


def test_huge_sizes_are_refused_before_any_tensor_exists():
    with pytest.raises(KnobError, match=r"full_pool_tokens='1000000000000': expected a number <= 268,435,456"):
        knobs.parse_sets(["full_pool_tokens=1000000000000"])
    with pytest.raises(KnobError, match="expected a number <= 4,096"):
        knobs.parse_sets(["page_size=100000"])
