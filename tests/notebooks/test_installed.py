"""An installed kvtrace (``pip install`` of the repository, not the checkout) carries its notebooks
and bundled data and runs them from any directory. The install is ``--no-deps
--no-build-isolation --target DIR`` of a copy of the working tree (the dependencies are this
environment's), put first on ``PYTHONPATH``; measured about 5-13 s on the 2-core machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".venv", ".git", "out", "runs", "build", "dist", ".pytest_cache", ".hypothesis", ".kvtrace-codes",
        "kvtrace.egg-info", "__pycache__", "production_1h"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP])
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.rmtree(src)  # nothing may come from the source tree
    return site


def _env(site):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    env["PYTHONPATH"] = str(site)
    return env


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_kvtrace_has_notebooks_data_and_reports_from_anywhere(installed, tmp_path):
    env = _env(installed)
    code = ("import replay, replay.paths as p; print(replay.__file__); print(p.notebooks_dir()); "
            "print(len(list(p.notebooks_dir().glob('0*.py')))); print(p.bundled('incidents/lost_unlock'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    mod, nbdir, count, incident = r.stdout.split("\n")[:4]
    assert mod.startswith(str(installed)) and nbdir.startswith(str(installed)) and incident.startswith(str(installed))
    assert count == "7"
    r = subprocess.run([sys.executable, "-m", "replay.cli", "report", incident, "--replay", "--out", "r.html"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict growing" in r.stdout and (tmp_path / "r.html").is_file()
    r = subprocess.run([sys.executable, "-m", "replay.cli", "lab", "--dry-run"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"--notebook-dir={nbdir}" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_notebook_06_runs_from_a_temp_directory(installed, tmp_path, monkeypatch):
    from tests.notebooks.test_notebooks import execute

    for k in [k for k in os.environ if k.startswith("KVTRACE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", str(installed))  # the kernel imports the installed kvtrace
    monkeypatch.chdir(tmp_path)
    nb_path = installed / "replay" / "_bundled" / "notebooks" / "06_incident_swa_growth.py"
    nb, elapsed, figures = execute(nb_path, tmp_path)
    assert figures and elapsed <= 60
    text = str([o for c in nb.cells for o in c.get("outputs", [])])
    assert str(installed) in text or "private_range_kept" in text
