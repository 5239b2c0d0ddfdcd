"""The suite cannot hang CI and its random draws can be reproduced: every test has a timeout
(pytest-timeout, a default in pyproject with named longer limits), and Hypothesis runs a fixed,
derandomized profile under CI=true (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import hypothesis

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_has_a_default_timeout(request):
    assert float(request.config.getini("timeout")) == 300


def test_hypothesis_profile_follows_ci():
    want = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    current = hypothesis.settings.default
    assert current.derandomize is (want == "ci")
    assert current.deadline is None


def test_a_hanging_test_fails_at_its_timeout(tmp_path):
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import time
        def test_hangs():
            time.sleep(120)
        def test_fine():
            pass
    """))
    t0 = time.monotonic()
    # the project's own pytest configuration, with the default lowered to 3 s for this check
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
                          "--rootdir", str(tmp_path), "-o", "timeout=3", "-p", "no:cacheprovider",
                          "-p", "no:randomly", str(tmp_path / "test_hang.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "Timeout" in out, out
    assert elapsed < 60, (elapsed, out)


def test_the_suite_writes_bytecode():
    """tests/conftest.py lets the suite's processes write .pyc (a process of a code or a server
    imports thousands of modules: compiled once, not in every process), whatever the caller's
    PYTHONDONTWRITEBYTECODE; it reaches the xdist workers and what they start."""
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ and sys.dont_write_bytecode is False
    out = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
