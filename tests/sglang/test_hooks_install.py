"""install()/uninstall(): idempotent, exact restore, silent when not recording, never raising."""

from __future__ import annotations

import pytest

import tracer
import tracer.sglang as hooks
from tests.sglang.hooks_fixtures import extend, recording, runtime, used
from tests.sglang.hooks_util import ledger, rows
from tracer.sglang import autoload_boot_names

pytestmark = pytest.mark.sglang

SWA16 = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=1024, swa_pool_tokens=512,
             max_running_requests=4)


def _snapshot():
    """Every attribute the hooks touch, as it is now (raw __dict__ entries)."""
    from sglang.srt.managers import schedule_batch, schedule_policy
    from sglang.srt.mem_cache import common, memory_pool_host, prefill_budget, unified_radix_cache
    from sglang.srt.mem_cache.allocator import base, paged, swa, token
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.pool_host import base as host_base, group
    from sglang.srt.mem_cache.unified_cache.components import swa as swa_comp

    owners = [base.BaseTokenToKVPoolAllocator, paged.PagedTokenToKVPoolAllocator,
              token.TokenToKVPoolAllocator, swa.SWATokenToKVPoolAllocator, ReqToTokenPool,
              host_base.HostKVCache, memory_pool_host.LogicalHostPool, group.HostPoolGroup,
              unified_radix_cache.UnifiedRadixCache, schedule_policy.PrefillAdder,
              prefill_budget.PrefillBudget, prefill_budget.SWAPrefillBudget, schedule_batch.Req,
              schedule_batch.ScheduleBatch]
    snap = {(o, k): v for o in owners for k, v in vars(o).items()}
    for mod in (common, schedule_batch, swa_comp):
        snap.update({(mod, k): v for k, v in vars(mod).items() if callable(v)})
    return snap


def test_install_idempotent_and_uninstall_restores_exact_originals():
    from replay.backends.sglang.env import bootstrap

    bootstrap()
    hooks.uninstall()
    before = _snapshot()
    n = hooks.install()
    assert n > 50 and hooks.is_installed()
    # every hot-path wrapper has its original's exact parameters (else a pass-through + failure)
    assert not [k for k in hooks.failures if k.startswith("install.")], dict(hooks.failures)
    assert hooks.install() == 0  # idempotent: nothing wrapped twice
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as Paged
    from sglang.srt.mem_cache.unified_cache.components import swa as swa_comp

    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator as Token
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    assert Paged.__dict__["alloc_extend"] is not before[(Paged, "alloc_extend")]
    # every paged free funnels through _release_page_ids: only that is wrapped on Paged itself
    assert Paged.__dict__["_release_page_ids"] is not before[(Paged, "_release_page_ids")]
    assert Paged.__dict__["free_page_ids"] is before[(Paged, "free_page_ids")]
    assert "free_segments" not in Paged.__dict__
    assert "free_segments" in Token.__dict__  # inherited base method: wrapped on the leaf only
    # decode allocation is measured around prepare_for_decode, not per leaf call
    assert Paged.__dict__["alloc_decode"] is before[(Paged, "alloc_decode")]
    assert ScheduleBatch.__dict__["prepare_for_decode"] is not before[(ScheduleBatch, "prepare_for_decode")]
    assert swa_comp.free_swa_out_of_window_slots is common.free_swa_out_of_window_slots
    assert common.free_swa_out_of_window_slots is not before[(common, "free_swa_out_of_window_slots")]
    hooks.uninstall()
    hooks.uninstall()  # idempotent
    after = _snapshot()
    assert set(after) == set(before)
    changed = [k for k in before if after[k] is not before[k]]
    assert changed == [], changed
    assert not hooks.is_installed()


def test_not_recording_writes_nothing_and_changes_nothing(tmp_path):
    from replay.backends.sglang.env import bootstrap

    bootstrap()
    hooks.install()
    try:
        with runtime(**SWA16) as rt:
            out = extend(rt.allocator, [0], [64], [-1])
            rt.allocator.free_segment(out, start_pos=0)
            assert used(rt.allocator) == {"full": 0, "swa": 0}
            tracer.start(tmp_path / "t", source="sglang-hooks")
            tracer.stop()
    finally:
        hooks.uninstall()
    assert rows(tmp_path / "t", "pool") == []


def test_a_failing_hook_never_raises_into_sglang(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("hook bug")

    import tracer

    with recording(tmp_path / "t") as path, runtime(**SWA16) as rt:
        monkeypatch.setattr(tracer, "pool", boom)  # any failure inside a hook
        out = extend(rt.allocator, [0], [64], [-1])  # the real op still completes
        assert out is not None and used(rt.allocator) == {"full": 64, "swa": 64}
        assert hooks.failures["allocator.alloc_extend"] == 2  # counted, once per leaf
        monkeypatch.undo()
        rt.allocator.free_segment(out, start_pos=0)
    assert ledger(path) == {"full": -64, "swa": -64}  # the lost rows show in the ledger


def test_the_gate_is_the_code_not_the_version_string(tmp_path):
    """Code that is no known target is refused (naming why); the version string decides nothing
    (tests/sglang/test_targets*.py has the rest)."""
    from tracer.sglang import targets

    fake = tmp_path / "sglang"
    (fake / "srt").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    det = targets.detect(fake)
    from unittest import mock

    with mock.patch.object(targets, "detect", return_value=det):
        with pytest.raises(hooks.UnsupportedSglang, match="no known target"):
            hooks.install()
    assert not hooks.is_installed()


def test_autoload_watch_list_covers_every_hooked_module():
    """autoload_boot.py (stdlib only, no kvtrace import) must watch each module a hook targets."""
    import re
    from pathlib import Path

    import tracer.sglang as pkg

    src_dir = Path(pkg.__file__).parent
    targets = set()
    for f in src_dir.rglob("*.py"):
        targets |= set(re.findall(r'target\("(sglang[\w.]+)"', f.read_text()))
    assert targets and targets <= set(autoload_boot_names())
