"""``kvtrace compare`` reads well: it fits COLUMNS, signed figures get absolute deltas, --json
names the base policy it used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sw") / "runs"
    res = CliRunner().invoke(main, ["sweep", str(ROOT / "data" / "incidents" / "healthy_chat"), "--policies",
                                    "baseline,swa-fixes", "--backend", "reference", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_fits_columns(sweep_dir, columns):
    res = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["compare", str(sweep_dir)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(map(len, lines)) <= columns, max(lines, key=len)
    assert lines[0].startswith("figure")  # transposed: figures as rows
    assert any(line.startswith("swa_used_slope_tokens_per_hour") for line in lines)


def test_wide_terminal_keeps_policies_as_rows(sweep_dir):
    res = CliRunner(env={"COLUMNS": "400"}).invoke(main, ["compare", str(sweep_dir)])
    assert res.output.splitlines()[0].startswith("policy")
    assert [line.split()[0] for line in res.output.splitlines()[2:]] == ["baseline", "swa-fixes"]


def test_signed_figures_get_absolute_deltas(sweep_dir):
    d = json.loads(CliRunner().invoke(main, ["compare", str(sweep_dir), "--json"]).output)
    fix = next(r for r in d["rows"] if r["policy"] == "swa-fixes")
    base = next(r for r in d["rows"] if r["policy"] == "baseline")
    f = "swa_used_slope_tokens_per_hour"
    assert fix[f"{f}_delta_pct"] is None
    assert fix[f"{f}_delta"] == pytest.approx(fix[f] - base[f])
    text = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["compare", str(sweep_dir)]).output
    row = next(line for line in text.splitlines() if line.startswith(f))
    assert "%" not in row and "(" in row and "-" in row.split("(")[-1] or fix[f"{f}_delta"] == 0, row
    assert fix["peak_swa_used_delta_pct"] is not None  # unsigned figures keep their percentage


def test_json_names_the_base(sweep_dir):
    d = json.loads(CliRunner().invoke(main, ["compare", str(sweep_dir), "--json"]).output)
    assert d["base"] == "baseline" and d["signed"] == ["swa_used_slope_tokens_per_hour"]
    d = json.loads(CliRunner().invoke(main, ["compare", str(sweep_dir), "--json", "--base", "swa-fixes"]).output)
    assert d["base"] == "swa-fixes" and d["rows"][0]["policy"] == "swa-fixes"
    res = CliRunner().invoke(main, ["compare", str(sweep_dir), "--base", "swa-fix"])
    assert res.exit_code == 2 and "kvtrace: error: " in res.output
