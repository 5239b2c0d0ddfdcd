"""HiCache ``write_back`` (outside the main grid): the cases that agree with the real code.

Both backends replay differential cases with ``hicache_write_policy=write_back``. ``s8`` and
``s11`` load back a host hit that exposes resident FULL behind host-only SWA (the admission keeps
its budget and shrinks its extend, sglang ``add_one_req``); ``s2`` still parts (docs/fidelity.md,
"Not covered by the suite").
"""

from __future__ import annotations

import pytest

from tests.differential.cases import CASES, write_case_workload

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

_BY_NAME = {c.name: c for c in CASES}


@pytest.mark.parametrize("name", ["s8-ps16-w8-full512-host1024", "s11-ps16-w32-full512-host1024"])
def test_write_back_case_agrees(tmp_path, name):
    from replay.runs.diff import diff_runs, request_hits
    from replay.runs.replay import replay_run

    case = _BY_NAME[name]
    wl = tmp_path / "wl"
    write_case_workload(case, wl)
    sets = case.sets() + ["hicache_write_policy=write_back"]
    for backend in ("reference", "sglang"):
        replay_run(wl, tmp_path / backend, policy="swa-fixes", sets=sets, backend=backend, progress=False)
    d = diff_runs(tmp_path / "reference", tmp_path / "sglang", context=2)
    assert d.identical, f"{name} (write_back): reference (A) vs sglang (B)\n{d.text()}"
    assert request_hits(tmp_path / "reference").to_dicts() == request_hits(tmp_path / "sglang").to_dicts()
