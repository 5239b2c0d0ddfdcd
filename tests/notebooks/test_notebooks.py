"""Execute every notebook headless (jupytext -> nbclient) on the bundled data: no cell may error,
every Plotly figure must have data, and each notebook must finish within 60 s."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.py"))
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def test_all_six_notebooks_are_present():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_with_nonempty_figures(path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    assert (ROOT / "data/traces/ab/baseline/manifest.json").is_file(), \
        "bundled data missing: run `.venv/bin/python data/traces/make_traces.py`"
    monkeypatch.delenv("KVTRACE_DATA", raising=False)
    monkeypatch.setenv("KVTRACE_ROOT", str(ROOT))
    nb = jupytext.read(path)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs committed"
    t0 = time.monotonic()
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    elapsed = time.monotonic() - t0
    figures = [o["data"][PLOTLY_MIME] for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []) if PLOTLY_MIME in o.get("data", {})]
    assert figures, f"{path.name}: no Plotly figure shown"
    for i, fig in enumerate(figures):
        points = sum(len(tr.get("x") or tr.get("y") or []) if not isinstance(tr.get("x") or tr.get("y"), dict)
                     else 1 for tr in fig.get("data", []))
        assert fig.get("data") and points > 0, f"{path.name}: figure {i} ({json.dumps(fig.get('layout', {}).get('title'))}) is empty"
    assert elapsed <= 60, f"{path.name} took {elapsed:.1f} s (budget 60 s)"
