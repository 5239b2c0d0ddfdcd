"""Capture levels (``--detail`` / ``KVTRACE_DETAIL``): ``steps``, ``counts``, ``pages``.

One small backend recording per level (real sglang classes): each level records exactly its
families, the manifest names the level, the occupancy identity holds at every ``stats`` row, and
a ``steps`` trace replays and passes ``inspect --strict``.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

from replay.backends.sglang import write_workload  # noqa: E402
from replay.cli import main  # noqa: E402
from replay.record import record_workload  # noqa: E402
from replay.trace import open_trace  # noqa: E402
from tests.sglang.backend_util import BLOCK, multi_turn_rows  # noqa: E402
from tests.sglang.hooks_util import identity_mismatches  # noqa: E402

pytestmark = pytest.mark.sglang

SMALL = ("page_size=16", "sliding_window_tokens=32", "full_pool_tokens=4096", "swa_pool_tokens=1024",
         "chunked_prefill_size=256", "max_running_requests=8")
FAMILIES = ("request", "sched", "stats", "pool", "cache")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Trace path per level, all of the same workload."""
    import tracer.sglang
    from replay.backends.sglang.env import bootstrap

    bootstrap()  # (sglang imports on CPU need the stand-ins before install() imports them)
    d = tmp_path_factory.mktemp("levels")
    w = write_workload(d / "w", multi_turn_rows(), hash_block_tokens=BLOCK)
    out = {}
    # Hooks already installed at counts (as another caller would leave them): each recording
    # installs its own level and gives the counts hooks back afterwards.
    mine = not tracer.sglang.is_installed()
    tracer.sglang.install(detail="counts")
    try:
        for level in ("steps", "counts", "pages"):
            tracer.sglang.failures.clear()  # (process-wide: only this recording's count)
            s = record_workload(w, d / level, overrides=SMALL, check_integrity_every=1, detail=level)
            assert s["hook_failures"] == {}
            assert tracer.sglang.installed_level() == "counts" and tracer.sglang.is_installed()
            out[level] = d / level
    finally:
        if mine:
            tracer.sglang.uninstall()
    return out


def _rows(path) -> dict[str, int]:
    tr = open_trace(path)
    return {f: tr.rows(f) for f in FAMILIES}


def test_steps_level_records_requests_steps_and_stats_only(traces):
    rows = _rows(traces["steps"])
    assert rows["pool"] == 0 and rows["cache"] == 0, rows
    assert rows["request"] == 2 * len(multi_turn_rows())  # an arrival and a finish each
    tr = open_trace(traces["steps"])
    assert set(tr.lazy("sched").collect()["kind"].cast(str)) == {"step"}  # no admission rows
    assert rows["stats"] > 0
    assert tr.manifest["options"]["detail"] == "steps"


def test_counts_and_pages_record_every_family(traces):
    for level in ("counts", "pages"):
        rows = _rows(traces[level])
        assert all(rows[f] > 0 for f in FAMILIES), (level, rows)
        tr = open_trace(traces[level])
        assert tr.manifest["options"]["detail"] == level
        ids = tr.lazy("pool").collect()["page_ids"]
        if level == "pages":
            assert ids.null_count() < len(ids)
        else:
            assert ids.null_count() == len(ids)


def test_levels_see_the_same_requests_and_steps(traces):
    """The hooks observe: every level sees the same arrivals (hash chains), finishes (cached
    tokens) and step rows."""
    frames = {}
    for level, p in traces.items():
        tr = open_trace(p)
        req = tr.lazy("request").collect().sort("seq")
        sched = tr.lazy("sched").collect()
        st = sched.filter(sched["kind"].cast(str) == "step")
        frames[level] = (req.select("event", "rid", "input_len", "output_len", "cached_len").to_dicts(),
                         st.select("mode", "batch_size", "num_tokens").to_dicts())
    assert frames["steps"] == frames["counts"] == frames["pages"]


def test_identity_at_every_stats_row_at_every_level(traces):
    for level, p in traces.items():
        n, bad = identity_mismatches(p)
        assert n > 0 and not bad, (level, bad[:5])


def test_steps_trace_replays_and_passes_strict_inspect(traces, tmp_path):
    res = CliRunner().invoke(main, ["inspect", "--strict", "--json", str(traces["steps"])])
    assert res.exit_code == 0, res.output
    from replay.runs import replay_run

    s = replay_run(str(traces["steps"]), out=str(tmp_path / "run"), detail="steps")
    n = len(multi_turn_rows())
    assert s.requests == n and s.finished == n
    assert s.peak_full_used > 0 and s.peak_swa_used > 0
    assert s.retractions is None and s.swa_evicted_tokens is None  # families not captured
    assert open_trace(tmp_path / "run").manifest["options"]["detail"] == "steps"
    assert _rows(tmp_path / "run")["pool"] == 0


def test_install_per_level_and_switch():
    import tracer.sglang
    from replay.backends.sglang.env import bootstrap
    from tracer.sglang import hooks

    bootstrap()
    was = tracer.sglang.is_installed()
    try:
        tracer.sglang.uninstall()
        tracer.sglang.install(detail="steps")
        steps_names = {f"{getattr(o, '__name__', o)}.{n}" for o, n, _ in tracer.sglang.patched()}
        assert hooks.installed_level() == "steps"
        assert not any(n.endswith(".match_prefix") or n.endswith(".lock") for n in steps_names)
        assert any(n.endswith("release_kv_cache") for n in steps_names)
        tracer.sglang.install(detail="counts")
        counts_names = {f"{getattr(o, '__name__', o)}.{n}" for o, n, _ in tracer.sglang.patched()}
        assert any(n.endswith(".match_prefix") for n in counts_names)
        assert len(counts_names) > 3 * len(steps_names), (len(counts_names), len(steps_names))
        tracer.sglang.install()  # no level: keeps the installed one
        assert hooks.installed_level() == "counts"
    finally:
        tracer.sglang.uninstall()
        if was:
            tracer.sglang.install()


def test_detail_setting_is_validated(monkeypatch):
    from tracer.sglang.runtime.state import resolve_detail

    monkeypatch.setenv("KVTRACE_DETAIL", "steps")
    assert resolve_detail(None) == "steps"
    monkeypatch.setenv("KVTRACE_DETAIL", "everything")
    with pytest.raises(ValueError, match="KVTRACE_DETAIL='everything': expected one of steps, counts, pages"):
        resolve_detail(None)
    res = CliRunner().invoke(main, ["record", "--detail", "rows", "--workload", "x", "--out", "y"])
    assert res.exit_code == 2 and "steps" in res.output
