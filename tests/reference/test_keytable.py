"""A sweep's zygote reads its source once and keys its requests once
(:mod:`replay.backends.reference.keytable`, ``replay.workloads.preload_workload``,
``replay.runs.worker.warm``): a run that reads its keys from the table computes the figures of a
run that keys its pages itself, and a sweep warmed so gives the rows of cold processes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from replay.backends.reference import keytable
from replay.backends.reference.keys import LazyPrompt, PageKeys, SequenceOrigins
from replay.backends.reference.request import output_plan
from replay.backends.sglang.tokens import TokenSynth
from replay.runs.replay import replay_run
from replay.workloads import preload_workload, read_workload
from replay.workloads import read as workload_read

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"
MEASURED = {"wall_s", "sched_cpu_ns", "host_alloc_cpu_ns", "host_free_cpu_ns", "run"}


@pytest.fixture
def clean_registry():
    yield
    workload_read._PRELOADED.clear()
    keytable._TABLES.clear()


@pytest.mark.parametrize("ps", (1, 16, 24))
def test_the_table_holds_the_keys_a_request_computes_alone(ps, clean_registry):
    """Every request's row is the keys of its whole planned sequence, as a PageKeys with no donor
    computes them (the table's donors only save work)."""
    wl = read_workload(WORKLOADS / "multi_turn")
    table = keytable.build(wl, ps)
    table.check_integrity()
    synth = TokenSynth(wl)
    for w in wl.requests[:150]:
        plan = output_plan(w)
        alone = PageKeys(LazyPrompt(synth, w, int(w.input_len)), ps, plan, SequenceOrigins(synth, w))
        assert table.of(w.rid) == alone.up_to(int(w.input_len) + len(plan)), w.rid
    assert table.of(-12345) is None


@pytest.mark.parametrize(("name", "policy", "sets"), [
    ("multi_turn", "baseline", ["page_size=16"]),
    ("agentic", "swa-fixes", ["page_size=64", "full_pool_tokens=120000", "swa_pool_tokens=12000"]),
    ("shared_prefix", "eic", ["page_size=8"]),
])
def test_a_run_reading_the_table_has_the_figures_of_one_keying_itself(name, policy, sets, tmp_path, clean_registry,
                                                                      monkeypatch):
    """The figures are the same whether a run keys each request as it reaches it (a workload past
    ``MAX_RUN_PAGES``), keys them all before its first step (``keytable.for_run``, the default),
    or reads a zygote's table."""
    source = WORKLOADS / name
    with monkeypatch.context() as m:
        m.setattr(keytable, "MAX_RUN_PAGES", 0)
        PageKeys.adopted_pages = 0
        plain = replay_run(source, tmp_path / "plain", policy=policy, sets=sets, backend="reference").to_dict()
        if name != "agentic":  # its requests share no leading block pages at page size 64
            assert PageKeys.adopted_pages > 0  # keyed as reached, from donors
    first = replay_run(source, tmp_path / "first", policy=policy, sets=sets, backend="reference").to_dict()
    assert {k: v for k, v in first.items() if k not in MEASURED} == \
        {k: v for k, v in plain.items() if k not in MEASURED}
    wl = preload_workload(source)
    ps = int(sets[0].split("=")[1])
    keytable.install(wl, keytable.build(wl, ps))
    assert keytable.lookup(read_workload(source), ps) is not None
    PageKeys.adopted_pages = 0
    warm = replay_run(source, tmp_path / "warm", policy=policy, sets=sets, backend="reference").to_dict()
    assert PageKeys.adopted_pages == 0  # every key came from the table
    assert {k: v for k, v in warm.items() if k not in MEASURED} == \
        {k: v for k, v in plain.items() if k not in MEASURED}
    assert keytable.lookup(wl, ps + 1) is None


def test_a_preloaded_workload_is_read_again_once_its_files_change(tmp_path, clean_registry):
    src = tmp_path / "wl"
    shutil.copytree(WORKLOADS / "multi_turn", src)
    wl = preload_workload(src)
    assert read_workload(src) is wl
    assert read_workload(src, rank=0) is not wl  # another key: read afresh
    manifest = src / "manifest.json"
    st = manifest.stat()
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again = read_workload(src)
    assert again is not wl and len(again.requests) == len(wl.requests)


def test_repeated_request_ids_get_no_table(clean_registry):
    wl = read_workload(WORKLOADS / "multi_turn")
    twice = type("W", (), {"requests": wl.requests[:3] + wl.requests[:1], "path": "twice",
                           "hash_block_tokens": wl.hash_block_tokens})()
    with pytest.raises(ValueError, match="request ids repeat"):
        keytable.build(twice, 16)


def test_a_warm_sweep_has_the_rows_of_cold_processes(tmp_path, monkeypatch):
    """The zygote keeps the source and its keys at each page size the runs use (zygote.json says
    so); the summaries equal those of a sweep run in cold processes."""
    from replay.runs.sweep import sweep

    if not hasattr(os, "fork"):
        pytest.skip("the warm zygote forks (Linux)")
    grid = ["page_size=1,16"]
    warm = sweep(WORKLOADS / "multi_turn", tmp_path / "warm", policies=["baseline", "swa-fixes"], grid=grid,
                 jobs=2, backend="reference")
    info = json.loads((tmp_path / "warm" / ".partial" / "zygote.json").read_text())
    assert info["warm"]["page_sizes"] == [1, 16] and info["warm"]["requests"] == 500 and info["warm"]["pages"] > 0
    assert info["warm"]["workers"] == 2
    monkeypatch.setenv("KVTRACE_SWEEP_ZYGOTE", "0")
    cold = sweep(WORKLOADS / "multi_turn", tmp_path / "cold", policies=["baseline", "swa-fixes"], grid=grid,
                 jobs=2, backend="reference")
    assert not (tmp_path / "cold" / ".partial" / "zygote.json").exists()
    keep = [c for c in warm.columns if c not in MEASURED]
    assert warm.select(keep).sort("policy", "page_size").equals(cold.select(keep).sort("policy", "page_size"))
    assert (warm["status"] == "ok").all() and warm.height == 4


def test_a_source_the_zygote_cannot_read_leaves_the_runs_to_say_so(tmp_path):
    """A warm that fails is noted in zygote.json; the runs go on and report the error themselves."""
    from replay.runs.pool import run_local

    if not hasattr(os, "fork"):
        pytest.skip("the warm zygote forks (Linux)")
    (tmp_path / "out" / ".partial").mkdir(parents=True)
    results = list(run_local([], 1, {"source": str(tmp_path / "nothing"), "page_sizes": [1]}))
    assert results == []  # no run: no zygote started
    from replay.runs.pool import ZygoteLauncher

    z = ZygoteLauncher(tmp_path / "out", "reference")
    try:
        z.warm({"source": str(tmp_path / "nothing"), "page_sizes": [1]})
        for _ in range(100):
            z.finished(0.1)
            if "warm" in z.ready:
                break
    finally:
        z.close()
    info = json.loads((tmp_path / "out" / ".partial" / "zygote.json").read_text())
    assert "not a directory" in info["warm"]["error"]



# in a fresh process: the test process has pytest-timeout's thread, and no fork happens beside a thread
_PARALLEL = r"""
import os, sys
from replay.backends.reference import keytable
from replay.workloads import read_workload
wl = read_workload(sys.argv[1])
keytable.MIN_PARALLEL_REQUESTS = 0
forks = []
real_fork, real_build, me = keytable._fork_share, keytable._build, os.getpid()
keytable._fork_share = lambda *a: forks.append(1) or real_fork(*a)
if sys.argv[2] == "fail":
    keytable._build = lambda w, ps, share: real_build(w, ps, share) if os.getpid() == me else 1 / 0
made = []
real_tmp = keytable.tempfile.TemporaryDirectory
keytable.tempfile.TemporaryDirectory = lambda **kw: made.append(kw.get("dir")) or real_tmp(**kw)
both = keytable.build(wl, 16, workers=2, scratch=sys.argv[3])
assert made == [sys.argv[3]] and os.listdir(sys.argv[3]) == [], (made, os.listdir(sys.argv[3]))
one = keytable.build(wl, 16)
both.check_integrity()
assert forks == [1], forks
assert both.pages == one.pages
assert all(both.of(w.rid) == one.of(w.rid) for w in wl.requests)
# the worker's share (odd sessions): a turn's leading keys are its previous turn's int objects
prev, shared = {}, 0
for w in wl.requests:
    if w.session_id >= 0 and w.session_id % 2:
        p, k = prev.get(w.session_id), both.of(w.rid)
        if p and k and p[0] == k[0]:
            assert p[0] is k[0], w.rid
            shared += 1
        prev[w.session_id] = k
assert shared > 0
print("same", both.pages)
"""


def _parallel(mode: str, scratch: Path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", _PARALLEL, str(WORKLOADS / "multi_turn"), mode, str(scratch)],
                          capture_output=True, text=True, timeout=240, cwd=Path(__file__).resolve().parents[2])


def test_sessions_dealt_to_forked_workers_give_the_same_table(tmp_path):
    """``workers=2``: a forked process keys half the sessions; the joined table is the one-process
    one; its share passes through the scratch directory given (the sweep's ``.partial``), left empty."""
    if not hasattr(os, "fork"):
        pytest.skip("keying in forked workers needs fork")
    out = _parallel("ok", tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("same "), out.stderr[-2000:]


def test_a_failed_worker_is_an_error_not_a_short_table(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("keying in forked workers needs fork")
    out = _parallel("fail", tmp_path)
    assert out.returncode != 0 and "RuntimeError: key table: worker 1 of 2 exited with status 1" in out.stderr


def test_warm_leaves_a_page_size_past_its_key_budget_to_the_runs(clean_registry):
    from replay.runs.worker import warm

    info = warm(str(WORKLOADS / "multi_turn"), [1, 16], max_pages=1_000_000)
    assert info["page_sizes"] == [16] and info["skipped_page_sizes"] == [1]
    assert 0 < info["pages"] <= 1_000_000 and info["requests"] == 500
    wl = read_workload(WORKLOADS / "multi_turn")
    assert keytable.lookup(wl, 16) is not None and keytable.lookup(wl, 1) is None
