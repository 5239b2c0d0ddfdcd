"""Execute every notebook headless (jupytext -> nbclient) on the bundled data, from a temporary
working directory with no ``KVTRACE_*`` variable set (the notebooks resolve the bundled data
through :mod:`replay.paths`): no cell may error, every Plotly figure must have data, each
notebook must finish within 60 s, and notebook 06 plots only its incident and the replays of
that incident (never another bundled trace)."""

from __future__ import annotations

import json
import time

import pytest

from replay.paths import bundled, notebooks_dir

NOTEBOOKS = sorted(notebooks_dir().glob("0*.py"))
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def test_all_seven_notebooks_are_present():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


def execute(path, cwd, timeout=120):
    """Run notebook ``path`` with the kernel in ``cwd``; returns (notebook, seconds, figures)."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs committed"
    t0 = time.monotonic()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    elapsed = time.monotonic() - t0
    figures = [o["data"][PLOTLY_MIME] for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []) if PLOTLY_MIME in o.get("data", {})]
    return nb, elapsed, figures


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_with_nonempty_figures(path, monkeypatch, tmp_path):
    assert bundled("traces/ab/baseline/manifest.json").is_file()
    for var in ("KVTRACE_DATA", "KVTRACE_ROOT", "KVTRACE_AFTER", "KVTRACE_FIXED_RUN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # not the checkout, not notebooks/
    kernel_tmp = tmp_path / "kernel-tmp"
    kernel_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(kernel_tmp))  # the kernel's temporary directory
    nb, elapsed, figures = execute(path, tmp_path)
    # what a notebook puts in the temporary directory goes when its kernel ends (torch's compile
    # cache, one per user and reused, is torch's own; ipykernel's own files are its own)
    left = [p.name for p in kernel_tmp.iterdir() if p.name.startswith("kvtrace-")]
    assert left == [], f"{path.name} left {left} in its temporary directory"
    assert figures, f"{path.name}: no Plotly figure shown"
    for i, fig in enumerate(figures):
        points = sum(len(tr.get("x") or tr.get("y") or []) if not isinstance(tr.get("x") or tr.get("y"), dict)
                     else 1 for tr in fig.get("data", []))
        assert fig.get("data") and points > 0, f"{path.name}: figure {i} ({json.dumps(fig.get('layout', {}).get('title'))}) is empty"
    assert elapsed <= 60, f"{path.name} took {elapsed:.1f} s (budget 60 s)"
    if path.stem.startswith("06"):
        last = figures[-1]
        names = [tr.get("name") for tr in last["data"]]
        assert names == ["recorded (this trace)", "replay, recorded settings", "replay, recommended"], names
        text = json.dumps([o for c in nb.cells for o in c.get("outputs", [])])
        assert "traces/ab" not in text  # no unrelated bundled trace
