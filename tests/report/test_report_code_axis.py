"""``kvtrace report`` on the code axis (issue 24 item 3): a sweep with a ``code=`` level gets the
codes compared (base: the first ``--code``; each figure's change at the same policy and grid
point, crossed with the grid's ``env.NAME`` points and with policies), the codes named (spec,
target, fingerprint) and a code that could not be prepared listed with its error; the report of a
single ``--code`` run names its code; a sweep without codes has no code section.

The sweeps are laid out from the bundled runs (tests/report/code_sweep.py), so no code's process
starts here and every figure is known; tests/fork/test_code_sweep_report.py reports on a real
sweep of the fork's two commits."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.paths import bundled
from replay.report import build_report
from replay.report import figures as F
from replay.report.codes import CODE_FIGURES, code_axis
from tests.report.code_sweep import ENV_KEY, grid_sweep, policy_sweep


def _summary(name: str) -> dict:
    return json.loads((bundled(f"traces/ab/{name}") / "summary.json").read_text())


def _section(page: str) -> str:
    return page[page.index('<section class="codes">'):page.index("<h2>Evidence</h2>")]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = grid_sweep(tmp_path_factory.mktemp("code-grid") / "R")
    res = build_report(root, root.parent / "r.html")
    return root, res, (root.parent / "r.html").read_text()


def test_codes_compared_at_each_grid_point_against_the_first_code(grid):
    root, res, page = grid
    ax = res["code_axis"]
    assert ax["base"] == "pre" and ax["keys"] == ["policy", ENV_KEY]  # the --code order, not the path order
    assert [c["name"] for c in ax["codes"]] == ["pre", "post", "bad"]
    pre, post, bad = ax["codes"]
    assert (pre["target"], post["target"]) == ("bytedance-dsv4-pre659", "bytedance-dsv4-post659")
    assert pre["runs"] == post["runs"] == 2 and pre["fingerprint_known"] and post["spec"].endswith("post659.tar.xz")
    assert bad["status"] == "failed" and "cannot prepare" in bad["error"] and bad["runs"] == 0
    axis = code_axis(root)
    base, fix = _summary("baseline"), _summary("swa-fixes")
    # point 1: pre ran as baseline, post as swa-fixes; point 2 the other way round: each delta is
    # taken at its own grid point, so the sign flips
    for pt, (p, q) in {("recorded", "1"): (base, fix), ("recorded", "2"): (fix, base)}.items():
        for f in ("ttft_p50_ms", "ttft_p99_ms", "prefix_hit_ratio", "peak_swa_used", "mean_swa_used", "retractions"):
            assert axis.value("pre", pt, f) == p[f] and axis.value("post", pt, f) == q[f], (pt, f)
        assert axis.value("post", pt, "shrunk_admissions") == 0  # neither bundled run shrinks a chunk
    df = axis.table()
    assert df.columns == ["figure", "policy", ENV_KEY, "pre", "post", "post_delta"]
    assert df["figure"].unique(maintain_order=True).to_list() == list(CODE_FIGURES)
    row = df.filter((df["figure"] == "ttft_p99_ms") & (df[ENV_KEY] == "2")).row(0, named=True)
    assert row["post_delta"] == pytest.approx(base["ttft_p99_ms"] - fix["ttft_p99_ms"])


def test_the_code_section_names_codes_and_shows_the_crossed_table(grid):
    root, res, page = grid
    sec = _section(page)
    assert page.index("Codes compared") < page.index("<h2>Evidence</h2>")
    for text in ("bytedance-dsv4-pre659", "bytedance-dsv4-post659", "08b6f0e5c092f0d9 (known)",
                 "sglang-post659.tar.xz", "pre (base)", "failed: code bad: cannot prepare",
                 f"code × policy × {ENV_KEY}", "shrunk admissions (count)", "TTFT p50 (ms)", "retractions (count)"):
        assert text in sec, text
    base, fix = _summary("baseline"), _summary("swa-fixes")
    pct = 100 * (fix["ttft_p99_ms"] - base["ttft_p99_ms"]) / base["ttft_p99_ms"]
    assert f"({pct:+.1f} %)" in sec and f"({-pct * base['ttft_p99_ms'] / fix['ttft_p99_ms']:+.1f} %)" in sec
    assert f"({fix['peak_swa_used'] - base['peak_swa_used']:+,})" in sec  # counts: the absolute change
    assert "Codes side by side" in sec  # the bars
    # without a recording, the base code's first run is the primary trace and the first proof column
    assert res["primary"].endswith(f"code=pre/policy=recorded/{ENV_KEY}=1")
    assert res["proof"]["columns"][0]["label"] == f"run code=pre/policy=recorded/{ENV_KEY}=1"


def test_code_figure_has_one_bar_per_code_at_each_point(grid):
    root, _, _ = grid
    fig = F.code_figure(code_axis(root))
    names = [t.name for t in fig.data]
    assert names[:2] == ["pre", "post"] and set(names) == {"pre", "post"}
    assert all(len(t.x) == 2 for t in fig.data)  # two grid points
    assert fig.layout.barmode == "group" and fig.layout.legend.title.text == "code"
    assert "shrunk admissions (count): 0 for every code." in F.notes(fig)


def test_codes_crossed_with_policies(tmp_path):
    root = policy_sweep(tmp_path / "R")
    res = build_report(root, tmp_path / "r.html")
    ax = res["code_axis"]
    assert ax["base"] == "base" and ax["keys"] == ["policy"]
    assert [c["target"] for c in ax["codes"]] == ["sglang-0.5.23", "bytedance-dsv4-post659"]
    axis = code_axis(root)
    assert axis.points() == [("baseline",), ("swa-fixes",), ("recorded",)]
    assert axis.value("post", ("baseline",), "ttft_p99_ms") is None
    assert axis.value("post", ("recorded",), "ttft_p99_ms") == _summary("swa-fixes")["ttft_p99_ms"]
    df = axis.table()
    assert df.filter(df["policy"] == "recorded")["post_delta"].null_count() == len(CODE_FIGURES)  # no base run there
    sec = _section((tmp_path / "r.html").read_text())
    assert "code × policy" in sec and "— (no run)" in sec and "installed" in sec


def test_a_single_code_run_names_its_code(grid, tmp_path):
    root, _, _ = grid
    run = root / "code=post" / "policy=recorded" / f"{ENV_KEY}=1"
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", str(run), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["code_axis"] is None
    [code] = res["codes"]
    assert (code["name"], code["target"], code["fingerprint"]) == ("post", "bytedance-dsv4-post659", "58394317f0758d21")
    sec = _section(out.read_text())
    assert "<h2>Code</h2>" in sec and "Codes compared" not in sec
    for text in ("bytedance-dsv4-post659", "58394317f0758d21 (known)", "sglang-post659.tar.xz", "66634ecf03c492ca"):
        assert text in sec, text
    r = CliRunner().invoke(main, ["report", str(run), "--out", str(out)])
    assert r.exit_code == 0 and "code post" in r.output and "bytedance-dsv4-post659, spec" in r.output, r.output


def test_a_sweep_without_codes_has_no_code_section(tmp_path):
    res = build_report(bundled("traces/ab"), tmp_path / "r.html")
    assert res["code_axis"] is None and res["codes"] == []
    page = (tmp_path / "r.html").read_text()
    assert 'class="codes"' not in page and "Runs side by side" in page
