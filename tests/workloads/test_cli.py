"""The `kvtrace workload` commands through the real entry point (subprocess) and CliRunner."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.cli import main

KVTRACE = shutil.which("kvtrace") or str(Path(sys.executable).parent / "kvtrace")
REQUIRED = ["requests", "sessions", "arrival_rate_per_s", "input_len_p50", "input_len_p99",
            "output_len_p50", "ideal_reuse_ratio"]


def test_done_when_generate_then_stats_json(tmp_path):
    """Issue 3's done-when command, verbatim, through the installed `kvtrace` script."""
    gen = subprocess.run(
        [KVTRACE, "workload", "generate", "--shape", "multi_turn", "--requests", "2000", "--seed", "1", "--out", "W"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert gen.returncode == 0, gen.stderr
    st = subprocess.run([KVTRACE, "workload", "stats", "W", "--json"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    s = json.loads(st.stdout)
    assert all(k in s for k in REQUIRED)
    assert s["requests"] == 2000
    assert s["arrival_rate_per_s"] == pytest.approx(3.4, rel=0.1)
    assert 0 < s["ideal_reuse_ratio"] < 1 and s["sessions"] < 2000


def _invoke(*args):
    """``kvtrace workload ARGS`` through the real entry point (its one error handler)."""
    return CliRunner().invoke(main, ["workload", *map(str, args)], catch_exceptions=False)


def test_import_export_stats_commands(tmp_path, fixture_path):
    r = _invoke("import", "mooncake", fixture_path("mooncake_small.jsonl"), "--out", tmp_path / "M")
    assert r.exit_code == 0, r.output
    r = _invoke("import", "bailian", fixture_path("bailian_small.jsonl"), "--out", tmp_path / "B")
    assert r.exit_code == 0, r.output
    r = _invoke("export", "mooncake", tmp_path / "M", "--out", tmp_path / "m.jsonl")
    assert r.exit_code == 0 and len((tmp_path / "m.jsonl").read_text().splitlines()) == 6
    r = _invoke("stats", tmp_path / "B")
    assert r.exit_code == 0 and "ideal prefix reuse" in r.output
    r = _invoke("stats", tmp_path / "M", "--json")
    assert json.loads(r.output)["requests"] == 6


def test_errors_are_one_line_with_exit_status_2(tmp_path, fixture_path):
    """The one convention of every command: refused input is ``kvtrace: error: ...``, exit 2."""
    src = fixture_path("mooncake_bad_field.jsonl")
    r = _invoke("import", "mooncake", src, "--out", tmp_path / "W")
    assert r.exit_code == 2
    assert r.output.strip() == f"kvtrace: error: {src}:3: field 'input_length': expected an integer, got \"abc\""
    assert not (tmp_path / "W").exists()
    r = _invoke("generate", "--shape", "nope", "--out", tmp_path / "X")
    assert r.exit_code == 2 and "known shapes: multi_turn" in r.output
    r = _invoke("generate", "--shape", "multi-turn", "--out", tmp_path / "X")
    assert r.exit_code == 2 and "(did you mean 'multi_turn'?)" in r.output
    r = _invoke("generate", "--shape", "multi_turn", "--set", "bogus", "--out", tmp_path / "X")
    assert r.exit_code == 2 and "expected KEY=VALUE" in r.output and "kvtrace: error:" in r.output
    r = _invoke("stats", tmp_path / "nothing")
    assert r.exit_code == 2 and "not a directory" in r.output and "kvtrace: error:" in r.output


def test_generate_with_overrides_and_force(tmp_path):
    args = ["generate", "--shape", "shared_prefix", "--requests", "50", "--seed", "3", "--qps", "2",
            "--set", "num_prefixes=2", "--hash-block-tokens", "64", "--out", tmp_path / "W"]
    assert _invoke(*args).exit_code == 0
    m = json.loads((tmp_path / "W" / "manifest.json").read_text())
    assert m["hash_block_tokens"] == 64 and m["workload"]["parameters"]["num_prefixes"] == 2
    assert m["workload"]["qps"] == 2.0
    assert _invoke(*args).exit_code == 2  # exists: refused
    assert _invoke(*args, "--force").exit_code == 0


@pytest.mark.parametrize(
    "cmd",
    [[], ["generate"], ["shapes"], ["import"], ["import", "mooncake"], ["import", "bailian"],
     ["export"], ["export", "mooncake"], ["stats"]],
)
def test_every_command_has_help(cmd):
    r = _invoke(*cmd, "--help")
    assert r.exit_code == 0
    body = r.output.split("\n\n", 2)[1].strip()
    assert len(body) > 20  # a real description, not just the usage line


def test_shapes_lists_parameters():
    r = _invoke("shapes")
    assert r.exit_code == 0
    for name in ["multi_turn", "agentic", "shared_prefix", "long_context", "mixed", "mean_turns = 4.0"]:
        assert name in r.output
