"""A key table keyed beside the run by a forked process (:mod:`replay.backends.reference.keystream`)
holds the keys of the table a run builds first, int for int, and shares the adopted keys' int
objects as it does; a process that fails or is killed leaves the run keying the rest itself (the
same keys, the reason said); closing stops and reaps the process; a figures-only replay reads
the same figures either way."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from replay.backends.reference import keybatch, keystream, keytable
from replay.workloads import read_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


def _signature(rows: list[list[int]]) -> list[list[tuple[int, int]]]:
    """Where each key object was first seen (row, position): equal signatures share keys alike."""
    first: dict[int, tuple[int, int]] = {}
    return [[first.setdefault(id(k), (j, i)) for i, k in enumerate(row)] for j, row in enumerate(rows)]


def _streamed(wl, ps: int) -> tuple[list[list[int]], keystream.KeyStream]:
    stream = keystream.KeyStream(wl, ps, keytable.planned_pages(wl, ps))
    try:
        rows = [stream.of(int(w.rid)) for w in wl.requests]
        stream.check_integrity()
    finally:
        stream.close()
    return rows, stream


@pytest.mark.parametrize("first", (7, 1000, keystream.FIRST_BATCH_PAGES))
@pytest.mark.parametrize("ps", (1, 16, 64))
@pytest.mark.parametrize("name", ("multi_turn", "shared_prefix", "mixed"))
def test_streamed_keys_are_the_first_built_tables(name, ps, first, monkeypatch):
    monkeypatch.setattr(keystream, "FIRST_BATCH_PAGES", first)
    wl = read_workload(WORKLOADS / name)
    want_rows = keybatch.build_rows(wl, ps, wl.requests)
    want = [want_rows[int(w.rid)] for w in wl.requests]
    got, stream = _streamed(wl, ps)
    assert got == want
    assert _signature(got) == _signature(want), "adopted keys are not the donor's objects as in the table"
    assert stream.fallback is None and not stream.running
    if first == 7:
        assert stream.waits >= 1
    if name == "multi_turn" and ps == 16:
        assert sum(map(len, got)) > len({id(k) for row in got for k in row}), "no key adopted"


def test_requests_are_listed_in_order_whichever_is_asked_first():
    wl = read_workload(WORKLOADS / "multi_turn")
    want = keybatch.build_rows(wl, 16, wl.requests)
    stream = keystream.KeyStream(wl, 16, keytable.planned_pages(wl, 16))
    try:
        last = int(wl.requests[-1].rid)
        assert stream.of(last) == want[last]
        assert stream.of(int(wl.requests[0].rid)) == want[int(wl.requests[0].rid)]
        assert stream.of(-12345) is None
    finally:
        stream.close()


def _failing_batches(after: int, how: str):
    """``key_batches`` that, in the keying process only (the run's fallback keys with the real
    one), exits or hangs at batch ``after``."""
    real, parent = keybatch.key_batches, os.getpid()

    def batches(*args, **kwargs):
        for i, batch in enumerate(real(*args, **kwargs)):
            if i == after and os.getpid() != parent:
                if how == "exit":
                    os._exit(1)
                time.sleep(60)  # killed by the test meanwhile
            yield batch

    return batches


@pytest.mark.parametrize("after", (0, 2))
def test_a_process_that_fails_leaves_the_run_the_same_keys(after, monkeypatch):
    wl = read_workload(WORKLOADS / "mixed")
    monkeypatch.setattr(keystream, "FIRST_BATCH_PAGES", 500)
    want = keybatch.build_rows(wl, 16, wl.requests)
    monkeypatch.setattr(keystream.keybatch, "key_batches", _failing_batches(after, "exit"))
    got, stream = _streamed(wl, 16)
    monkeypatch.undo()
    assert got == [want[int(w.rid)] for w in wl.requests]
    assert stream.fallback is not None and "exit status 1" in stream.fallback
    assert not stream.running


def test_a_killed_process_leaves_the_run_the_same_keys(monkeypatch):
    wl = read_workload(WORKLOADS / "mixed")
    monkeypatch.setattr(keystream, "FIRST_BATCH_PAGES", 500)
    want = keybatch.build_rows(wl, 16, wl.requests)
    monkeypatch.setattr(keystream.keybatch, "key_batches", _failing_batches(1, "sleep"))
    stream = keystream.KeyStream(wl, 16, keytable.planned_pages(wl, 16))
    try:
        first = stream.of(int(wl.requests[0].rid))  # the first batch came
        os.kill(stream._pid, signal.SIGKILL)
        got = [stream.of(int(w.rid)) for w in wl.requests]
    finally:
        stream.close()
    assert first == want[int(wl.requests[0].rid)]
    assert got == [want[int(w.rid)] for w in wl.requests]
    assert "killed by signal 9" in stream.fallback


def test_close_stops_and_reaps_a_keying_process(monkeypatch):
    wl = read_workload(WORKLOADS / "mixed")
    monkeypatch.setattr(keystream.keybatch, "key_batches", _failing_batches(0, "sleep"))
    stream = keystream.KeyStream(wl, 16, keytable.planned_pages(wl, 16))
    pid = stream._pid
    stream.close()
    stream.close()  # idempotent
    assert not stream.running
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_for_run_streams_large_tables_only_where_it_can(monkeypatch):
    wl = read_workload(WORKLOADS / "mixed")
    planned = keytable.planned_pages(wl, 16)
    monkeypatch.setattr(keystream, "MIN_STREAM_PAGES", planned + 1)
    assert isinstance(keytable.for_run(wl, 16), keytable.KeyTable)
    monkeypatch.setattr(keystream, "MIN_STREAM_PAGES", 0)
    monkeypatch.setattr(keystream.threading, "active_count", lambda: 2)  # another thread: no fork
    assert isinstance(keytable.for_run(wl, 16), keytable.KeyTable)
    monkeypatch.setattr(keystream.threading, "active_count", lambda: 1)
    table = keytable.for_run(wl, 16)
    try:
        assert isinstance(table, keystream.KeyStream)
    finally:
        table.close()


def test_for_run_keys_first_when_no_process_can_be_forked(monkeypatch):
    wl = read_workload(WORKLOADS / "mixed")
    monkeypatch.setattr(keystream, "MIN_STREAM_PAGES", 0)
    monkeypatch.setattr(keystream.threading, "active_count", lambda: 1)

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(keystream.os, "fork", no_fork)
    table = keytable.for_run(wl, 16)
    assert isinstance(table, keytable.KeyTable)
    assert table.of(int(wl.requests[0].rid)) == keybatch.build_rows(wl, 16, wl.requests[:1])[int(wl.requests[0].rid)]


@pytest.mark.parametrize("policy", ("swa-fixes", "baseline"))
def test_a_figures_only_replay_reads_the_same_figures(policy, tmp_path, monkeypatch):
    from replay.runs.replay import replay_run

    monkeypatch.setattr(keystream.threading, "active_count", lambda: 1)
    made = []

    class Counted(keystream.KeyStream):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(keystream, "KeyStream", Counted)
    figures = []
    for i, min_pages in enumerate((1 << 60, 0)):
        monkeypatch.setattr(keystream, "MIN_STREAM_PAGES", min_pages)
        s = replay_run(str(WORKLOADS / "mixed"), backend="reference", policy=policy, out=tmp_path / f"r{i}",
                       detail="figures")
        d = {k: v for k, v in s.to_dict().items() if k not in ("wall_s", "sched_cpu_ns", "run", "command_wall_s")}
        figures.append(d)
    assert figures[0] == figures[1]
    assert len(made) == 1 and made[0].fallback is None and not made[0].running  # the second run streamed
