"""A real code A/B sweep with an ``env.NAME`` grid point, reported: ``sweep --code pre=<pre659>,
post=<post659> --grid env.SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER=2`` on the small multi_turn
workload under SWA pressure of tests/fork/test_code_replay.py (two fork processes, one per code,
~60 s). Checked: the grid point is a hive level ``env.NAME=2`` below ``policy=``, the switch
reached each code's own process (the manifest's ``env`` block is what that process's tracer saw),
and ``kvtrace report`` compares the codes at that point: the figures ``compare`` gives, and the
shrunk admissions of #659's SWA-pressure chunk cap (pre659 has none; post659 shrinks)."""

from __future__ import annotations

import json

import pytest

from tests.fork.conftest import fork_tarball, require_fork
from tests.fork.test_code_replay import SIZES, _workload

NAME = "SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER"
LEVEL = f"env.{NAME}=2"

# one worker with the other module-fixture fork sweep (make test: --dist loadgroup), so the two
# sweeps' fork processes do not compete for the machine's cores
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("fork-code-replay")]


@pytest.fixture(scope="module")
def env_sweep(tmp_path_factory):
    require_fork()
    from replay.runs.sweep import sweep

    tmp = tmp_path_factory.mktemp("code-env-sweep")
    wl = _workload(tmp / "wl")
    codes = {"pre": str(fork_tarball("pre659")), "post": str(fork_tarball("post659"))}
    df = sweep(wl, tmp / "R", policies=["recorded"], sets=SIZES, grid=[f"env.{NAME}=2"], jobs=2, codes=codes)
    return {"root": tmp / "R", "df": df, "tmp": tmp}


def test_the_env_point_is_a_level_and_reaches_each_code_process(env_sweep):
    root, df = env_sweep["root"], env_sweep["df"]
    assert df["status"].to_list() == ["ok", "ok"], df.select("run", "status", "error").to_dicts()
    assert df[f"env.{NAME}"].to_list() == ["2", "2"]
    for code in ("pre", "post"):
        run = root / f"code={code}" / "policy=recorded" / LEVEL
        assert (run / "summary.json").is_file(), sorted(str(p.relative_to(root)) for p in root.rglob("summary.json"))
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["env"].get(NAME) == "2"  # written by the tracer inside the code's process
        assert manifest["run"]["env"].get(NAME) == "2" and manifest["run"]["code"]["name"] == code
        assert json.loads((run / "summary.json").read_text())["env"].get(NAME) == "2"


def test_report_compares_the_codes_at_the_env_point(env_sweep):
    from replay.report import build_report
    from replay.runs.compare import compare

    root = env_sweep["root"]
    out = env_sweep["tmp"] / "r.html"
    res = build_report(root, out)
    ax = res["code_axis"]
    assert ax["base"] == "pre" and ax["keys"] == ["policy", f"env.{NAME}"]
    assert [(c["name"], c["target"], c["fingerprint_known"]) for c in ax["codes"]] == [
        ("pre", "bytedance-dsv4-pre659", True), ("post", "bytedance-dsv4-post659", True)]
    rows = {r["code"]: r for r in ax["rows"]}
    cmp = {r["code"]: r for r in compare(root).iter_rows(named=True)}
    for code in ("pre", "post"):
        for f in ("finished", "ttft_p50_ms", "ttft_p99_ms", "prefix_hit_ratio", "peak_swa_used", "retractions"):
            assert rows[code][f] == cmp[code][f], (code, f)
    # #659's chunk cap: pre659 has no shrinking path at all; post659 cuts chunks under SWA pressure
    assert rows["pre"]["shrunk_admissions"] == 0 and rows["post"]["shrunk_admissions"] > 0, rows
    page = out.read_text()
    sec = page[page.index('<section class="codes">'):page.index("<h2>Evidence</h2>")]
    assert f"code × policy × env.{NAME}" in sec and "bytedance-dsv4-post659" in sec
    assert f"{rows['post']['shrunk_admissions']} (+{rows['post']['shrunk_admissions']})" in sec
