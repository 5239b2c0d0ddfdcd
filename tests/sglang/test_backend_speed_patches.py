"""Speed levers of the real-Scheduler backend leave every decision unchanged.

- ``patches.SPEED_PATCHES`` (the Scheduler's load-snapshot writer dropped, the prefill log line's
  pending-token sum skipped; both at build): a replay with each and one without give the same
  steps and the same trace rows (sched/cache/stats/request).
- ``SglangBackend.run`` steps under ``torch.no_grad`` (as sglang's ``event_loop_normal``): the same
  steps as stepping by hand with autograd on.
"""

from __future__ import annotations

import dataclasses

import pytest

from replay.backends.sglang import SglangBackend, SglangSettings
from tests.sglang.backend_util import multi_turn_rows, workload

pytestmark = pytest.mark.sglang

SETTINGS = SglangSettings(page_size=16, sliding_window_tokens=32, full_pool_tokens=2048, swa_pool_tokens=512,
                          chunked_prefill_size=256, max_prefill_tokens=512, max_running_requests=6,
                          scheduler="real")


@pytest.fixture(autouse=True)
def _sglang():
    from replay.backends.sglang.env import bootstrap

    bootstrap()


class _Steps:
    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.finishes: list[tuple] = []

    def on_arrival(self, wreq, clock_ns) -> None:
        pass

    def on_finish(self, wreq, req, clock_ns, reason) -> None:
        self.finishes.append((wreq.rid, clock_ns, reason, len(req.output_ids), int(req.cached_tokens)))

    def on_step(self, record, backend) -> None:
        occ = {k: v.as_dict() for k, v in backend.occupancy().items()}
        self.rows.append((dataclasses.replace(record, cpu_ns=0), len(backend.waiting), sorted(occ.items())))


def _steps(w, *, by_hand: bool = False) -> _Steps:
    obs = _Steps()
    with SglangBackend(w, SETTINGS, observer=obs) as be:
        if by_hand:
            import torch

            assert torch.is_grad_enabled()
            while not be.done:
                be.step()
            be.close_step()
        else:
            be.run()
    return obs


def test_speed_patch_table_and_writer_dropped(tmp_path):
    from replay.backends.sglang.patches import SPEED_PATCHES

    assert [p.target.split(" ")[0] for p in SPEED_PATCHES] == [
        "Scheduler.load_snapshot_writer", "Scheduler.load_inquirer._get_num_pending_tokens"]
    w = workload(tmp_path, multi_turn_rows(num_sessions=2, turns=1))
    with SglangBackend(w, SETTINGS) as be:
        assert be.sched.load_snapshot_writer is None
        assert be.sched.publish_load_snapshot(force=True) is None
        assert be.sched.load_inquirer._get_num_pending_tokens(chunk_deduct=5) == 0


#: each speed patch's function in ``patches`` (bound to a no-op: the replay without it)
SPEED_FUNCS = ("drop_load_snapshot", "skip_pending_tokens")


def test_pending_tokens_read_only_by_the_prefill_log_line():
    """The skipped sum has one caller in sglang 0.5.23, and its value one reader: the log line."""
    import inspect

    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.managers.scheduler_components import metrics_reporter

    src = inspect.getsource(sched_mod)
    assert src.count("_get_num_pending_tokens(") == 1
    assert "num_pending_tokens=self.load_inquirer._get_num_pending_tokens(" in src
    rep = inspect.getsource(metrics_reporter)
    assert [ln.strip() for ln in rep.splitlines() if "prefill_stats.num_pending_tokens" in ln] == [
        'f"#pending-token: {prefill_stats.num_pending_tokens}, "']


@pytest.mark.parametrize("func", SPEED_FUNCS)
def test_speed_patch_changes_no_step(tmp_path, monkeypatch, func):
    import replay.backends.sglang.patches as patches

    w = workload(tmp_path, multi_turn_rows(num_sessions=4, turns=3, gap_ms=50.0))
    fast = _steps(w)
    monkeypatch.setattr(patches, func, lambda sched: None)
    slow = _steps(w)
    assert len(fast.rows) > 20 and any(r[0].mode == "decode" for r in fast.rows)
    assert fast.rows == slow.rows
    assert fast.finishes == slow.finishes


def test_run_without_autograd_matches_steps_with_it(tmp_path):
    w = workload(tmp_path, multi_turn_rows(num_sessions=4, turns=3, gap_ms=50.0))
    assert _steps(w).rows == _steps(w, by_hand=True).rows


@pytest.mark.parametrize("func", SPEED_FUNCS)
def test_speed_patch_leaves_the_trace_unchanged(tmp_path, monkeypatch, func):
    """With the hooks on: the same sched, cache, stats and request rows (measured CPU aside)."""
    import replay.backends.sglang.patches as patches
    from tests.sglang.test_scheduler_agreement import _record, _views

    w = workload(tmp_path, multi_turn_rows(num_sessions=3, turns=2, gap_ms=50.0))
    _record(w, SETTINGS, tmp_path / "fast")
    monkeypatch.setattr(patches, func, lambda sched: None)
    _record(w, SETTINGS, tmp_path / "slow")
    fast, slow = _views(tmp_path / "fast"), _views(tmp_path / "slow")
    assert fast.keys() == slow.keys() and all(fast[k] for k in fast)
    assert fast == slow
