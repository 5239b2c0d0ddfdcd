"""The suite cannot hang CI and its random draws can be reproduced: every test has a timeout
(pytest-timeout, a default in pyproject with named longer limits), and Hypothesis runs a fixed,
derandomized profile under CI=true (tests/conftest.py)."""

from __future__ import annotations

import json
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


def test_make_test_runs_each_module_and_each_xdist_group_on_one_worker(tmp_path):
    """tests/xdist_groups.py: with ``-n 2 --dist loadgroup`` (make test) a module's tests, and an
    ``xdist_group``'s across modules, run on one worker (module fixtures once, not per worker)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.xdist_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401\n")
    grouped = textwrap.dedent("""
        import time, pytest
        pytestmark = pytest.mark.xdist_group("g1")
        @pytest.fixture(scope="module", params=["a", "b"])
        def p(request):
            return request.param
        @pytest.mark.parametrize("i", range(3))
        def test_x(p, i):
            time.sleep(0.05)
    """)
    plain = textwrap.dedent("""
        import time, pytest
        @pytest.mark.parametrize("i", range(5))
        def test_y(i):
            time.sleep(0.05)
    """)
    for name, text in (("test_g1.py", grouped), ("test_g2.py", grouped), ("test_a.py", plain),
                       ("test_b.py", plain), ("test_c.py", plain)):
        (tmp_path / name).write_text(text)
    res = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stdout + res.stderr
    workers: dict[str, set] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("[gw0]", "[gw1]") and "PASSED" in parts:
            nodeid = parts[-1]
            unit = nodeid.split("@")[1] if "@" in nodeid else nodeid.split("::")[0]
            workers.setdefault(unit, set()).add(parts[0])
    assert set(workers) == {"g1", "test_a.py", "test_b.py", "test_c.py"}, res.stdout
    assert all(len(w) == 1 for w in workers.values()), workers


def test_make_test_hands_out_the_longest_units_first_and_reports_unit_times(tmp_path):
    """tests/xdist_groups.py: the queue is ordered by the measured seconds of UNIT_SECONDS (a
    unit absent there by its number of tests), so each worker starts on one of the two longest
    units; the run ends with each worker's busy time and the units' seconds (printed, and as JSON
    with KVTRACE_UNIT_SECONDS_OUT)."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import tests.xdist_groups as g
        from tests.xdist_groups import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401
        g.UNIT_SECONDS.clear()
        g.UNIT_SECONDS.update({"test_c.py": 100.0, "test_b.py": 50.0})
    """))
    many = "import time, pytest\n@pytest.mark.parametrize('i', range(12))\ndef test_x(i):\n    time.sleep(0.05)\n"
    few = "import time, pytest\n@pytest.mark.parametrize('i', range(3))\ndef test_y(i):\n    time.sleep(0.05)\n"
    for name, text in (("test_a.py", many), ("test_b.py", few), ("test_c.py", few), ("test_d.py", few)):
        (tmp_path / name).write_text(text)
    out = tmp_path / "units.json"
    res = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), KVTRACE_UNIT_SECONDS_OUT=str(out)))
    assert res.returncode == 0, res.stdout + res.stderr
    first: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("[gw0]", "[gw1]") and "PASSED" in parts:
            first.setdefault(parts[0], parts[-1].split("::")[0])
    assert sorted(first.values()) == ["test_b.py", "test_c.py"], res.stdout  # not test_a's 12 tests
    assert "xdist units (tests/xdist_groups.py)" in res.stdout and "gw0: busy" in res.stdout, res.stdout
    got = json.loads(out.read_text())
    assert set(got["units"]) == {"test_a.py", "test_b.py", "test_c.py", "test_d.py"}
    assert got["units"]["test_a.py"] >= 0.55 and got["units"]["test_d.py"] >= 0.14  # 12 and 3 sleeps of 0.05 s
    assert set(got["workers"]) == {"gw0", "gw1"}
    assert set(got["spans"]) == set(got["units"]) and {x["worker"] for x in got["spans"].values()} == {"gw0", "gw1"}
    assert min(w["idle_tail_s"] for w in got["workers"].values()) == 0


def test_unit_order_is_longest_first():
    from tests.xdist_groups import UNKNOWN_TEST_S, unit_order

    units = {"many.py": 700, "live-x": 4, "few.py": 2, "mid.py": 30}
    measured = {"live-x": 150.0, "few.py": 40.0}
    assert UNKNOWN_TEST_S * 700 > 150.0 > 40.0 > UNKNOWN_TEST_S * 30
    assert unit_order(units, measured) == ["many.py", "live-x", "few.py", "mid.py"]
    assert unit_order({"a": 1, "b": 1, "c": 2}, {}) == ["c", "a", "b"]  # ties: the given order
    # a merged unit: the sum of its members' seconds
    assert unit_order({"m": 9, "x.py": 5}, {"a.py": 50.0, "b.py": 20.0, "x.py": 60.0},
                      {"a.py": "m", "b.py": "m"}) == ["m", "x.py"]


def test_the_fork_code_units_are_scheduled_as_one():
    """The units whose tests call the fork's codes in the worker go to one worker (its warm code
    processes are imported once), and stay distinct units in the report."""
    from tests.xdist_groups import MERGED, scheduled_unit, unit_of

    one = {scheduled_unit(n) for n in ("tests/fork/test_fork_env.py::test_a",
                                       "tests/claims/test_fork_659.py::test_b[x]@fork-659-claims",
                                       "tests/codes/test_warm.py::test_c@fork-driver")}
    assert one == {"fork-warm"}
    assert unit_of("tests/codes/test_warm.py::test_c@fork-driver") == "fork-driver"
    assert scheduled_unit("tests/live/test_live_fork.py::test_d[pth]@live-fork") == "live-fork"
    assert "live-fork" not in MERGED  # servers: their own processes, no warm parent
    from tests.xdist_groups import merged_tests

    ids = ["tests/codes/test_warm.py::test_c@fork-driver", "tests/codes/test_warm.py::test_d@fork-driver",
           "tests/fork/test_fork_driver.py::test_e@fork-driver",
           "tests/fork/test_fork_env.py::test_a", "tests/fork/test_fork_env.py::test_b"]
    got = list(merged_tests(dict.fromkeys(ids, False)))
    # MERGED's order, test_warm.py last in its group (it ends the other warm parents), each
    # module whole and as collected
    assert got == ids[3:] + ids[2:3] + ids[:2]
