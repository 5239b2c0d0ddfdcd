"""How ``make test`` (``-n 2 --dist loadgroup``) shares the tests between its two xdist workers.

The unit of work is a **module**, or an ``xdist_group`` where one is marked (a group may span
modules): all of its tests run on one worker, so a module fixture (a server, a fork run, a
sweep) is computed once, not once on each worker, and no worker waits idle on
``tests/live/live_util.shared_once``'s lock while the other runs the server.

Three hooks, imported by ``tests/conftest.py``:

- :func:`pytest_collection_modifyitems` (on a worker) names the group in a grouped test's id,
  ``path::test[param]@group``, as pytest-xdist's own loadgroup does; its line for that sets
  ``item._nodeid``, which pytest >= 9.2 no longer reads (the id is the structured ``item._id``),
  so with pytest 9.2 and xdist 3.8 every ``xdist_group`` mark was silently ignored;
- :func:`pytest_xdist_make_scheduler` (on the controller) schedules by group, else by module
  (xdist's loadgroup would send each ungrouped test on its own), **longest unit first**: xdist
  hands units out in order of their number of tests, so the few-test, long units (a live
  server's module: 4-8 tests behind a 150 s setup; the Hypothesis state machines: 3 tests,
  200 s) came last and one worker ran them alone while the other had nothing left. Ordered by
  :data:`UNIT_SECONDS` (measured in CI), the queue ends with short units and the two workers
  finish close together (longest-processing-time-first). The units of :data:`MERGED` go as one
  (the fork's warm code processes are per worker: one worker imports each fork code once);
- :class:`UnitTimes` (on the controller) prints, at the end of the run, each worker's busy time
  and idle tail and the longest units, in the form :data:`UNIT_SECONDS` takes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict, defaultdict

import pytest

# Seconds each unit took in CI (``make test`` on a fresh clone, 2 cores; setup + call + teardown
# of its tests, as printed by UnitTimes at the end of the run). Only the order matters: units
# absent here rank by UNKNOWN_TEST_S per test. Sources: the CI log at cd3f671 (its 25 slowest
# durations summed per unit: lower bounds) and, marked "alone", the module run by itself
# (pytest -q, one process) on the shared 2-core machine at a load of 3-4 (about CI's contention).
UNIT_SECONDS: dict[str, float] = {
    "live-fork": 211.1,
    "tests/memory/test_model_machine.py": 197.2,
    "fork-code-replay": 182.6,
    "tests/reference/test_fast_paths_exact.py": 164.6,  # alone (CI at cd3f671 ran 3 cases fewer)
    "live-launch": 160.4,
    "live-pth": 150.3,
    "tests/live/test_live_overhead_bench.py": 137.1,
    "fork-driver": 118.2,
    "tests/workloads/test_generate_extremes.py": 118.4,  # alone
    "fork-capture-scheduler": 117.9,  # alone
    "tests/runs/test_sweep.py": 106.2,
    "tests/sglang/test_scheduler_agreement.py": 97.7,  # alone
    "tests/runs/test_sweep_zygote.py": 125.0,
    "fork-dsv4-differential": 74.9,
    "tests/cli/test_terminal.py": 73.5,
    "tests/differential/test_backends_agree.py": 64.1,  # alone
    "tests/runs/test_signals.py": 57.1,
    "tests/workloads/test_compact.py": 55.2,
    "tests/sglang/test_targets_launch.py": 51.7,
    "fork-dsv4-replay": 50.3,  # alone
    "tests/claims/test_host_free.py": 47.7,
    "tests/test_cli.py": 47.1,
    "fork-659-claims": 44.7,
    # alone, each about 20 s (some of it importing sglang, which a CI worker has done before)
    "tests/claims/test_lru_refresh.py": 23.6,
    "tests/claims/test_chunked_release.py": 21.1,
    "tests/claims/test_admission.py": 20.4,
    "tests/runs/test_plan_faults.py": 25.0,  # measured alone, quiet (2026-12-03)
    "tests/faults/test_replay_faults.py": 61.0,  # measured alone, one core busy elsewhere (2026-12-03)
}
# Units scheduled as one (on one worker, one after the other, in this order): the units whose
# tests call into the DeepSeek-V4 fork's codes in the worker's own process. Those calls go to
# warm parents kept per worker process (replay.codes.warm: one per code and SGLANG_*/KVTRACE_*
# environment; each start imports the fork's sglang: 12-34 s measured on the loaded machine);
# split over both workers, each worker imported the same codes again. Each commit is called bare
# and with a run's SGLANG_* environment (4 keys), and tests/codes/test_warm.py lowers the number
# kept to 1 (MERGED_LAST: run last). Measured on these 10 modules' 35 calls in one process
# (2026-12-02): 9 starts with test_warm.py before tests/fork/test_fork_driver.py, 7 in this order
# with 4 kept (tests/conftest.py); replayed with 2 kept and the units split at random over two
# workers (what make test did): 9 to 18, median 15.
MERGED: dict[str, str] = {u: "fork-warm" for u in (
    "fork-capture-scheduler", "fork-dsv4-replay", "fork-dsv4-differential", "fork-659-claims",
    "tests/fork/test_fork_capture_pools.py", "tests/fork/test_fork_kv_bytes.py",
    "tests/fork/test_fork_env.py", "fork-driver")}
# A unit not in UNIT_SECONDS: this many seconds per test (every test not among CI's 25 slowest
# took under 35 s; most take well under a second).
UNKNOWN_TEST_S = 1.0


def _loadgroup(config) -> bool:
    """``--dist loadgroup``: on the controller its ``dist``; on a worker (whose ``dist`` xdist
    resets to ``no``) the ``loadgroup`` flag xdist sets from it."""
    return config.getoption("dist", default="no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def group_of(item) -> str | None:
    """The ``xdist_group`` names of ``item`` joined as xdist joins them, or ``None``."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def unit_of(nodeid: str) -> str:
    """The work unit of a (worker-side) test id: its ``@group``, else its module's path."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.split("@")[-1]
    return nodeid.split("::", 1)[0]


def scheduled_unit(nodeid: str) -> str:
    """The unit the scheduler hands out: :func:`unit_of`, or the unit :data:`MERGED` joins it to."""
    unit = unit_of(nodeid)
    return MERGED.get(unit, unit)


# Modules run last in their MERGED member: tests/codes/test_warm.py lowers KVTRACE_CODE_WARM_MAX
# to 1 (it checks the least recently used parent exits), which ends the worker's other parents.
MERGED_LAST = ("tests/codes/test_warm.py",)


def merged_tests(tests: dict[str, bool]) -> dict[str, bool]:
    """A scheduled unit's tests ({nodeid: done}), those of :data:`MERGED` members in its order,
    :data:`MERGED_LAST` modules at the end of theirs (each module's tests as collected: a module
    stays contiguous, its fixtures set up once)."""
    rank = {u: i for i, u in enumerate(MERGED)}

    def key(it):
        return rank.get(unit_of(it[1]), -1), it[1].split("::", 1)[0] in MERGED_LAST, it[0]

    return {nodeid: tests[nodeid] for _, nodeid in sorted(enumerate(tests), key=key)}


def unit_order(units: dict[str, int], seconds: dict[str, float] | None = None,
               merged: dict[str, str] | None = None) -> list[str]:
    """``units`` ({unit: number of tests}) longest first: by the measured seconds of
    :data:`UNIT_SECONDS` (a :data:`MERGED` unit: the sum over its members), else
    ``UNKNOWN_TEST_S`` per test; ties keep the given order."""
    seconds = UNIT_SECONDS if seconds is None else seconds
    merged = MERGED if merged is None else merged
    members: dict[str, list[str]] = defaultdict(list)
    for m, u in merged.items():
        members[u].append(m)

    def estimate(u: str) -> float:
        if u in seconds:
            return seconds[u]
        known = [seconds[m] for m in members.get(u, ()) if m in seconds]
        return sum(known) if known else UNKNOWN_TEST_S * units[u]

    return sorted(units, key=lambda u: -estimate(u))


def _set_nodeid(item, nodeid: str) -> None:
    ident = getattr(item, "_id", None)
    if ident is not None and dataclasses.is_dataclass(ident) and hasattr(ident, "_str_cache"):
        new = dataclasses.replace(ident)  # pytest >= 9.2: str(item._id) is the nodeid
        object.__setattr__(new, "_str_cache", nodeid)
        item._id = new
    else:
        item._nodeid = nodeid  # pytest < 9.2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    if not (os.environ.get("PYTEST_XDIST_WORKER") and _loadgroup(config)):
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):  # xdist did not
            _set_nodeid(item, f"{item.nodeid}@{group}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupOrModuleScheduling(LoadGroupScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scheduled_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the first hand-out: the queue is complete, longest first
                self._ordered = True
                order = unit_order({u: len(tests) for u, tests in self.workqueue.items()})
                self.workqueue = OrderedDict((u, merged_tests(self.workqueue[u])) for u in order)
            super()._assign_work_unit(node)

    if not config.pluginmanager.has_plugin("kvtrace-unit-times"):
        config.pluginmanager.register(UnitTimes(config), "kvtrace-unit-times")
    return GroupOrModuleScheduling(config, log)


class UnitTimes:
    """On the xdist controller: each unit's seconds (setup + call + teardown of its tests) and
    each worker's busy span, printed after the run; ``KVTRACE_UNIT_SECONDS_OUT=path`` also
    writes them as JSON (``{"units": {unit: s}, "workers": {...}, "spans": {unit: {worker,
    start_s, end_s}}}``)."""

    TOP = 40

    def __init__(self, config) -> None:
        self.config = config
        self.units: dict[str, float] = defaultdict(float)
        self.first: dict[str, float] = {}  # worker -> first start, last stop, busy seconds
        self.last: dict[str, float] = {}
        self.busy: dict[str, float] = defaultdict(float)
        self.spans: dict[str, list] = {}  # unit -> [worker, first start, last stop]

    def pytest_runtest_logreport(self, report) -> None:
        node = getattr(report, "node", None)
        if node is None:
            return
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        self.units[unit_of(report.nodeid)] += report.duration
        self.busy[worker] += report.duration
        start, stop = getattr(report, "start", 0) or 0, getattr(report, "stop", 0) or 0
        if start and stop:
            self.first[worker] = min(self.first.get(worker, start), start)
            self.last[worker] = max(self.last.get(worker, stop), stop)
            span = self.spans.setdefault(unit_of(report.nodeid), [worker, start, stop])
            span[1], span[2] = min(span[1], start), max(span[2], stop)

    def summary(self) -> dict:
        t0 = min(self.first.values(), default=0.0)
        end = max(self.last.values(), default=0.0)
        workers = {w: {"busy_s": round(self.busy[w], 1), "end_s": round(self.last.get(w, t0) - t0, 1),
                       "idle_tail_s": round(end - self.last.get(w, t0), 1)} for w in sorted(self.busy)}
        units = {u: round(s, 1) for u, s in sorted(self.units.items(), key=lambda kv: -kv[1])}
        spans = {u: {"worker": w, "start_s": round(a - t0, 1), "end_s": round(b - t0, 1)}
                 for u, (w, a, b) in sorted(self.spans.items(), key=lambda kv: kv[1][1])}
        return {"units": units, "workers": workers, "spans": spans}

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.units:
            return
        s = self.summary()
        tr = terminalreporter
        tr.section("xdist units (tests/xdist_groups.py)")
        for w, v in s["workers"].items():
            tr.write_line(f"{w}: busy {v['busy_s']:.1f} s, last test ended at {v['end_s']:.1f} s, "
                          f"then idle {v['idle_tail_s']:.1f} s")
            last = [(u, x) for u, x in s["spans"].items() if x["worker"] == w][-3:]
            tr.write_line("  its last units: " + ", ".join(
                f"{u} ({x['start_s']:.0f}-{x['end_s']:.0f} s)" for u, x in last))
        top = dict(list(s["units"].items())[: self.TOP])
        tr.write_line(f"the {len(top)} longest of {len(s['units'])} units, seconds "
                      f"(UNIT_SECONDS takes these): {json.dumps(top)}")
        out = os.environ.get("KVTRACE_UNIT_SECONDS_OUT")
        if out:
            with open(out, "w") as f:
                json.dump(s, f, indent=1)
