"""Overhead of the capture hooks on the DeepSeek-V4 fork's own Scheduler (``sglang_overhead.py
--target fork-post659`` runs this beside the 0.5.23 figure, in one command).

:func:`measure_in_fork` runs in the fork's process (``replay.codes.call_in_code``): the same
requests through ``replay.backends.fork.driver.run_requests`` (the fork's Scheduler on the DSV4
pools, forward replaced) with the hooks off, off again (the noise floor) and at each level,
alternating the order over ``repeat`` rounds. A step is one iteration of the driver's loop,
timed in the loop thread's CPU time from one ``get_next_batch_to_run`` call to the next (the
hooked class method is called through an instance attribute that times it). The runs are
deterministic (same steps in the same order, checked), so, as in ``sglang_overhead.py``, each
step's fastest time over the rounds is taken per mode and summed; ``us_per_step`` is the excess
over hooks off per step, ``us_per_step_trimmed`` the mean per-step excess without the 10 % of
steps at each end, ``us_per_step_median`` the median step's.

:func:`fork_vs_upstream` (main venv) runs 0.5.23's ``counts`` figure (``sglang_overhead.measure``,
the real-code backend) and this one on the same workload and returns both and their ratio
(``resolved``: each excess is more than twice its noise floor; otherwise the ratio says nothing).

Measured (2-core VM at load 7-10, 40 requests of data/workloads/mixed, 8 rounds, post659):
0.5.23 35.7 us/step trimmed (noise -18.2; step 1024 us, 1660 steps), fork 63.9 (noise 60.1;
step 1221 us, 606 steps, ~5 rows per step): ratio 1.79, not resolved (the fork's noise floor is
as large as its figure; another run at the same load gave -109 with noise -165). Each fork run
builds a new Scheduler in the same process, so runs drift with the heap and the machine's load
more than the 0.5.23 backend's do; a quiet machine (or ``nice -n -15``) is needed to resolve it.

Quiet machine (load < 1, ``nice -n -10``, 2026-12-01 18:24-18:31, ``bench/sglang_overhead.py --target
fork-post659 --workload data/workloads/mixed --requests 40 --json``): ``--repeat 6``: 0.5.23 98.4
(noise 12.6), fork 52.5 (noise -30.2): ratio 0.53, not resolved; ``--repeat 10``: 0.5.23 49.2 (noise
-3.5; median 39.5), fork 126.9 (noise -2.2; median 92.4): ratio 2.58, **resolved: the target
(<= 1.3x) is not met**. Not yet known where the fork's excess goes (no per-hook breakdown).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

LEVELS = ("steps", "counts", "pages")


def _timed_make_scheduler(orig, sink: list):
    """``make_scheduler`` whose scheduler records the loop thread's CPU time at each
    ``get_next_batch_to_run`` call (``sink``: ns stamps)."""
    tt = time.thread_time_ns

    def make_scheduler(*args, **kwargs):
        sched = orig(*args, **kwargs)
        gnb = type(sched).get_next_batch_to_run  # (the hooked one when installed)

        def get_next_batch_to_run():
            sink.append(tt())
            return gnb(sched)

        sched.get_next_batch_to_run = get_next_batch_to_run
        return sched

    return make_scheduler


def _one_run(requests: list[dict], opts: dict, level: str | None, out: Path) -> tuple[list, dict]:
    import tracer
    import tracer.sglang
    from replay.backends.fork import driver
    from replay.backends.fork import scheduler as fsched

    import gc

    gc.collect()  # (the previous run's Scheduler and pools, not collected during this run)
    stamps: list[int] = []
    orig = fsched.make_scheduler
    fsched.make_scheduler = _timed_make_scheduler(orig, stamps)
    try:
        if level is not None:
            tracer.sglang.install(detail=level)
            tracer.start(out, source="bench-fork", detail=level)
        try:
            s = driver.run_requests(requests, **opts)
        finally:
            if level is not None:
                tracer.stop()
                tracer.sglang.uninstall()
    finally:
        fsched.make_scheduler = orig
    if level is not None and tracer.sglang.failures:
        raise RuntimeError(f"hook failures: {dict(tracer.sglang.failures)}")
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    key = {"steps": s["steps"], "finished": {k: v["output_tokens"] for k, v in s["finished"].items()},
           "cached": s["cached_tokens"]}
    if level is not None:
        from replay.trace import open_trace
        from tracer.schema import FAMILIES

        tr = open_trace(out)
        if tr.num_dropped:
            raise RuntimeError(f"the {level} run dropped {tr.num_dropped} events")
        _events[level] = sum(tr.rows(f) for f in FAMILIES)
    return steps, key


_events: dict = {}  # level -> rows recorded by its last run


def _excess(runs: list[list[int]], off: list[list[int]]) -> dict:
    mins = [min(x) for x in zip(*runs)]
    base = [min(x) for x in zip(*off)]
    d = [a - b for a, b in zip(mins, base)]
    srt = sorted(d)
    k = len(srt) // 10
    mid = srt[k:len(srt) - k] or srt
    return {"us_per_step": round(sum(d) / len(d) / 1e3, 2),
            "us_per_step_trimmed": round(sum(mid) / len(mid) / 1e3, 2),
            "us_per_step_median": round(statistics.median(d) / 1e3, 2)}


def measure_in_fork(requests: list[dict], *, repeat: int = 3, levels: tuple = ("counts",),
                    driver_opts: dict | None = None) -> dict:
    """(In the fork's process.) Per level ``us_per_step`` (+ ``_trimmed``, ``_median``) of the
    hooks over hooks off on the fork's Scheduler; ``noise_*`` the same for off again;
    ``backend_step_us`` the hooks-off step. Raises RuntimeError: the hooks changed the run."""
    import importlib

    import sglang.srt.managers.scheduler  # noqa: F401  (imported before install, as in a server)

    for m in ("allocator", "swa_memory_pool", "memory_pool", "memory_pool_host",
              "unified_radix_cache", "common"):
        importlib.import_module("sglang.srt.mem_cache." + m)
    opts = {"kind": "dsv4", **(driver_opts or {})}
    modes = ("off", "off2") + tuple(levels)
    runs: dict[str, list] = {m: [] for m in modes}
    tmp = Path(tempfile.mkdtemp(prefix="kvtrace-bench-fork-"))
    reference = None
    t0 = time.perf_counter()
    try:
        _one_run(requests, opts, None, tmp / "warm")  # warm-up: imports, first builds
        for i in range(repeat):
            for m in (modes if i % 2 == 0 else modes[::-1]):
                steps, key = _one_run(requests, opts, None if m.startswith("off") else m,
                                      tmp / f"{m}{i}")
                if reference is None:
                    reference = key
                elif key != reference:
                    raise RuntimeError(f"the {m} run differs from the first: {key} != {reference}")
                runs[m].append(steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(runs["off"][0])
    base_us = sum(min(x) for x in zip(*runs["off"])) / n / 1e3
    out = {"levels": {lv: _excess(runs[lv], runs["off"]) for lv in levels},
           "noise": _excess(runs["off2"], runs["off"]), "num_steps": n,
           "backend_step_us": round(base_us, 1), "repeat": repeat,
           "num_requests": len(requests), "wall_s": round(time.perf_counter() - t0, 1),
           "events": dict(_events)}
    for v in out["levels"].values():
        v["pct_of_backend_step"] = round(v["us_per_step"] / base_us * 100, 2)
    return out


def fork_vs_upstream(workload: Path, *, target: str = "fork-post659", requests: int = 60,
                     repeat: int = 3, max_input_tokens: int = 1024, max_new_tokens: int = 32) -> dict:
    """(Main venv.) 0.5.23's ``counts`` figure and the fork's, on the first ``requests`` of
    ``workload``, and ``ratio`` = fork / 0.5.23 (``us_per_step_trimmed``; the issue's target:
    <= 1.3)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang_overhead as so

    from replay.backends.fork.workload import requests_from_workload
    from replay.codes import call_in_code, prepare

    commit = target.removeprefix("fork-")
    tarball = Path(__file__).resolve().parents[2] / "shared" / "targets" / "bytedance-dsv4" / \
        f"sglang-{commit}.tar.xz"
    if not tarball.is_file():
        raise FileNotFoundError(f"{tarball}: the fork's tarball for --target {target} is absent")
    up = so.measure(workload, requests=requests, repeat=repeat, levels=("counts",), sample=False)
    reqs = requests_from_workload(workload, max_requests=requests,
                                  max_input_tokens=max_input_tokens,
                                  max_new_tokens=max_new_tokens, step_ns=20_000_000)
    fork = call_in_code(prepare(tarball), "bench.fork_overhead:measure_in_fork",
                        {"requests": reqs, "repeat": repeat,
                         "driver_opts": {"max_running_requests": 32}}, timeout_s=1800).result
    u = up["levels"]["counts"]
    f = fork["levels"]["counts"]
    keys = ("us_per_step", "us_per_step_trimmed", "us_per_step_median")
    return {"target": target, "workload": str(workload), "requests": requests, "repeat": repeat,
            "sglang-0.5.23": {**{k: u[k] for k in keys}, "backend_step_us": up["backend_step_us"],
                              "noise_us_per_step_trimmed": up["noise_us_per_step_trimmed"],
                              "num_steps": up["num_steps"]},
            "fork": {**{k: f[k] for k in keys}, "backend_step_us": fork["backend_step_us"],
                     "noise_us_per_step_trimmed": fork["noise"]["us_per_step_trimmed"],
                     "num_steps": fork["num_steps"]},
            "ratio": round(f["us_per_step_trimmed"] / u["us_per_step_trimmed"], 2)
            if u["us_per_step_trimmed"] > 0 else None,
            "ratio_sum": round(f["us_per_step"] / u["us_per_step"], 2) if u["us_per_step"] > 0 else None,
            "target_ratio": 1.3,
            # the ratio means something only when each excess is well above its noise floor
            "resolved": all(abs(v["noise_us_per_step_trimmed"]) * 2 < v["us_per_step_trimmed"]
                            for v in (u | {"noise_us_per_step_trimmed": up["noise_us_per_step_trimmed"]},
                                      f | {"noise_us_per_step_trimmed": fork["noise"]["us_per_step_trimmed"]}))}


def print_table(r: dict) -> None:
    """The ``fork_vs_upstream`` result as lines."""
    print(f"workload {r['workload']}: first {r['requests']} requests, {r['repeat']} rounds, "
          f"level counts (loop-thread CPU, per-step minimum over rounds)")
    print(f"{'':16}{'us/step':>9}{'trimmed':>9}{'median':>9}{'noise':>8}{'step us':>9}{'steps':>7}")
    for name in ("sglang-0.5.23", "fork"):
        v = r[name]
        print(f"{name:16}{v['us_per_step']:>9.1f}{v['us_per_step_trimmed']:>9.1f}"
              f"{v['us_per_step_median']:>9.1f}{v['noise_us_per_step_trimmed']:>8.1f}"
              f"{v['backend_step_us']:>9.1f}{v['num_steps']:>7}")
    print(f"fork / 0.5.23 (trimmed): {r['ratio']}  (sum: {r['ratio_sum']}; target <= "
          f"{r['target_ratio']}){'' if r.get('resolved') else '  NOT resolved: within the noise'}")
