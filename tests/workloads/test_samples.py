"""The committed samples in data/workloads are what `make data` produces now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.workloads.io import read_workload
from replay.workloads.make_data import SAMPLES, main

DATA = Path(__file__).resolve().parents[2] / "data" / "workloads"


def _manifest(d: Path) -> dict:
    m = json.loads((d / "manifest.json").read_text())
    m["producer"].pop("version")
    return m


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    assert main(["--out-dir", str(out), "--small-only"]) == 0
    return out


@pytest.mark.parametrize("name", [s.name for s in SAMPLES if s.committed])
def test_committed_sample_is_up_to_date(name, regenerated):
    assert (DATA / name).is_dir(), f"missing {DATA / name}: run `make data`"
    assert _manifest(DATA / name) == _manifest(regenerated / name)
    assert read_workload(DATA / name).table.equals(read_workload(regenerated / name).table), (
        f"{DATA / name} is stale: run `make data`"
    )


def test_committed_mooncake_export_is_up_to_date(regenerated):
    name = "multi_turn.mooncake.jsonl"
    assert (DATA / name).read_bytes() == (regenerated / name).read_bytes()


def test_large_sample_is_not_committed():
    (large,) = [s for s in SAMPLES if not s.committed]
    ignore = (DATA.parents[1] / ".gitignore").read_text().splitlines()
    assert f"/data/workloads/{large.name}/" in ignore
    # about an hour of traffic at the requested rate
    assert 3000 <= large.options.num_requests / large.options.qps <= 4200
