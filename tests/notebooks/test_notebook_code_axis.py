"""The policy A/B notebook (05) on a code-axis sweep (``kvtrace sweep --code pre=A,post=B`` with an
``env.NAME`` grid, laid out from the bundled runs by tests/report/code_sweep.py): ``code`` is a
dimension like ``policy``: the runs table has it, the code × policy × grid table and the codes'
bars are shown (one bar colour per code, base first), and every figure has data."""

from __future__ import annotations

import json

import pytest

from replay.paths import notebooks_dir
from tests.notebooks.test_notebooks import execute
from tests.report.code_sweep import ENV_KEY, grid_sweep


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_policy_ab_notebook_treats_code_as_a_dimension(monkeypatch, tmp_path):
    root = grid_sweep(tmp_path / "R")
    for var in ("KVTRACE_ROOT", "KVTRACE_AFTER", "KVTRACE_FIXED_RUN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KVTRACE_DATA", str(root))
    monkeypatch.chdir(tmp_path)
    [path] = notebooks_dir().glob("05_*.py")
    nb, elapsed, figures = execute(path, tmp_path)
    titles = [json.dumps(f.get("layout", {}).get("title")) for f in figures]
    code_figs = [f for f, t in zip(figures, titles) if "Codes side by side (base pre)" in t]
    assert len(code_figs) == 1, titles
    names = [tr.get("name") for tr in code_figs[0]["data"]]
    assert names[:2] == ["pre", "post"] and set(names) == {"pre", "post"}
    for i, fig in enumerate(figures):
        drawn = [tr for tr in fig.get("data", []) if tr.get("x") is not None or tr.get("y") is not None]
        assert drawn, f"figure {i} ({titles[i]}) is empty"
    text = json.dumps([o for c in nb.cells for o in c.get("outputs", [])])
    assert "post_delta" in text and ENV_KEY in text  # the code x policy x grid table
    assert "code=pre" in text and "code=post" in text  # the runs table, a run per code and point
    assert elapsed <= 60, f"{path.name} took {elapsed:.1f} s (budget 60 s)"
