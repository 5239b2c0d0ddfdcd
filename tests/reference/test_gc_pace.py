"""A reference run collects cyclic garbage less often, and gives the process its pace back."""

from __future__ import annotations

import gc

import pytest

from replay.backends.reference.gc_pace import RUN_YOUNG_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_the_young_threshold_is_raised_inside_and_restored_after(thresholds):
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (RUN_YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(KeyError), fewer_collections():
        raise KeyError("a run that fails")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_process_that_collects_less_often_or_never_keeps_its_pace(thresholds):
    for mine in ((0, 10, 10), (10 * RUN_YOUNG_THRESHOLD, 5, 5)):
        gc.set_threshold(*mine)
        with fewer_collections():
            assert gc.get_threshold() == mine
        assert gc.get_threshold() == mine


def test_a_run_leaves_the_thresholds_as_it_found_them(thresholds, tmp_path):
    from pathlib import Path

    from replay.runs.replay import replay_run

    gc.set_threshold(555, 7, 9)
    replay_run(Path(__file__).resolve().parents[2] / "data" / "workloads" / "mixed", tmp_path / "r",
               policy="swa-fixes", backend="reference", detail="figures")
    assert gc.get_threshold() == (555, 7, 9)


def test_the_runs_own_key_table_is_built_at_the_runs_pace(thresholds, monkeypatch):
    from pathlib import Path

    from replay.backends.reference import keytable
    from replay.backends.reference.scheduler import ReferenceBackend
    from replay.backends.reference.settings import ReferenceSettings
    from replay.workloads import read_workload

    seen = []
    build = keytable.for_run

    def spy(workload, page_size):
        seen.append(gc.get_threshold())
        return build(workload, page_size)

    monkeypatch.setattr(keytable, "for_run", spy)
    gc.set_threshold(555, 7, 9)
    wl = read_workload(Path(__file__).resolve().parents[2] / "data" / "workloads" / "mixed")
    with ReferenceBackend(wl, ReferenceSettings()) as be:
        assert be._key_table is not None
    assert seen == [(RUN_YOUNG_THRESHOLD, 7, 9)]
    assert gc.get_threshold() == (555, 7, 9)
