"""The two backends' settings: one set of fields, defaults and checks (replay.backends.settings)."""

from __future__ import annotations

import pytest

from replay import knobs
from replay.backends.reference.settings import ReferenceSettings
from replay.backends.sglang.settings import SglangSettings, from_knobs, setting_names

BOTH = (ReferenceSettings, SglangSettings)


def test_fields_and_defaults_are_the_knob_tables():
    shared = [n for n in knobs.defaults() if n != "scheduler"]
    assert setting_names() == shared + ["scheduler"]
    assert set(ReferenceSettings.setting_names()) == set(knobs.defaults()) - {"scheduler"}
    for cls in BOTH:
        assert cls().to_dict() == {k: v for k, v in knobs.defaults().items() if k in cls.setting_names()}


@pytest.mark.parametrize("cls", BOTH)
@pytest.mark.parametrize("kw, message", [
    ({"full_pool_tokens": 1000}, "full_pool_tokens=1000 is not a multiple of page_size=16"),
    ({"full_pool_tokens": 96, "swa_full_tokens_ratio": 0.25}, "SWA pool of 16 tokens is too small for page_size 16"),
    ({"sliding_window_tokens": 4096, "swa_pool_tokens": 4096},
     "sliding_window_tokens=4096 does not fit the SWA pool of 4096 tokens; expected a window below the pool size"),
    ({"host_pool_tokens": 8}, "host_pool_tokens=8 is below one page"),
    ({"page_size": 0}, "page_size=0: expected a number >= 1"),
    ({"host_free": "eager"}, "host_free='eager': expected one of eager_cat, lazy_merge"),
])
def test_shared_checks_give_the_same_message(cls, kw, message):
    with pytest.raises(ValueError) as e:
        cls(**kw)
    assert str(e.value) == message


def test_each_backend_refuses_what_only_the_other_expresses():
    with pytest.raises(ValueError, match="cannot be expressed by the sglang backend; use --backend reference"):
        SglangSettings(prefix_ownership="eic_release_protected_prefix")
    with pytest.raises(ValueError, match="cannot be expressed by the reference backend; use --backend sglang"):
        ReferenceSettings(eviction_policy="slru")
    with pytest.raises(ValueError, match="schedules fcfs only; use --backend sglang"):
        ReferenceSettings(schedule_policy="lpm")
    with pytest.raises(ValueError, match="needs an SWA model"):
        ReferenceSettings(prefix_ownership="eic_release_protected_prefix", sliding_window_tokens=0)
    with pytest.raises(ValueError, match="patches the Python tree core"):
        SglangSettings(swa_lru_refresh="full_ancestry", tree_core="rust")


def test_from_knobs_ignores_knobs_the_backend_does_not_take():
    values = knobs.defaults() | {"scheduler": "real", "page_size": 32}
    assert from_knobs(values).scheduler == "real" and from_knobs(values).page_size == 32
    assert ReferenceSettings.from_knobs(values).page_size == 32
    assert "scheduler" not in ReferenceSettings.from_knobs(values).to_dict()
