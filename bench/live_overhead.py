"""Per-step cost of each capture level on a live CPU sglang server (issue 12, item 2).

One ``python -m sglang.launch_server`` per mode (the tiny random-weight Llama and the flags of
tests/live, plus ``--sleep-on-idle`` and one torch thread): ``off`` (no hooks), each level of
``--levels`` under ``kvtrace launch --detail LEVEL``, and ``off2`` (hooks off again: the noise
floor). Every server has the bench's step timer (``bench/live_timer/sitecustomize.py``) in its
scheduler process, so steps are timed the same way with hooks off and on: per event-loop
iteration, the scheduler thread's CPU time (``time.thread_time_ns``: other processes on a
shared machine do not count, though they still slow it through caches and preemption) and
wall time, with the batch the iteration ran (forward mode, batch size, tokens) and the CPU time
of the model forward inside it. One torch thread, because with several the scheduler thread's
CPU time counts its spin-waits for the others.

All servers start at once and stay up (idle ones asleep on their sockets). Each gets the same
fixed requests: one warm-up wave, ``/flush_cache`` (the timer starts afresh there and the radix
cache is empty again), then ``--waves`` waves of ``--batch`` requests sent as one batched
``/generate`` (token ids; prompts share one of two prefixes, so later waves hit the cache).
The waves are interleaved: wave ``w`` goes to every server in turn, the order rotated each
wave, so a change of the machine's load falls on every mode alike. A last ``/flush_cache``
makes each timer write its iterations.

Live steps are not identical from run to run, so like is compared with like: iterations are
grouped by (forward mode, batch size, tokens // 64); per group present in both runs with
``--min-group`` iterations, the hooked run's statistic minus the off run's, weighted by the
group's count in the hooked run:

- ``us_per_step``: per-group minimum excess (as the backend bench's per-step minimum);
- ``us_per_step_median``: per-group median excess (robust to steps never run uncontended);
- ``us_per_step_mean``: per-group mean excess (includes time-driven work such as the 10 ms
  ``stats`` sample, and is the noisiest);
- ``*_sched``: the same on the iteration's CPU minus the model forward's (the scheduler's own
  work, where every kvtrace hook runs; steadier, since the forward's CPU varies most);
- ``us_per_step_paired_sched``: when both runs ran the same sequence of batches (usual: the
  waves are batched and finish together), the median over steps of the per-step difference of
  the ``_sched`` figure, step i against step i (run within seconds of each other);
- ``noise_*``: the same figures for ``off2`` against ``off``: differences of that size mean
  nothing;
- ``server_step_us`` / ``server_step_cpu_us``: the off run's median busy iteration in wall and
  scheduler-thread CPU time; ``pct_of_server_step``: ``us_per_step`` as a share of it;
- ``steps``, ``steps_compared`` (in groups of both runs), ``idle_iterations``, ``requests``,
  ``start_s`` (server start-up) and ``kvtrace_recording`` (checked in the scheduler process).

    python bench/live_overhead.py --json                   # off, steps, counts, pages, off2
    python bench/live_overhead.py --levels counts --waves 4 # smaller

The start-ups overlap (25-35 s each on a quiet machine, alone); 4.5 min in all for the five
modes and 12 waves at load 10-16 on the 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIMER_DIR = ROOT / "bench" / "live_timer"
LEVELS = ("steps", "counts", "pages")
EXTEND, DECODE = 1, 2  # sglang ForwardMode values
EXTRA_FLAGS = ("--sleep-on-idle",)  # idle servers wait on their sockets instead of spinning
MODE_NAMES = {EXTEND: "extend", DECODE: "decode", 3: "mixed", 4: "idle"}


# ------------------------------------------------------------------ requests
def wave_prompts(wave: int, batch: int) -> list[list[int]]:
    """Wave ``wave``'s prompts: one of two 40-token prefixes, then 4..39 tokens of its own."""
    prefix = list(range(10 + 40 * (wave % 2), 50 + 40 * (wave % 2)))
    return [prefix + [100 + (wave * 37 + i * 11 + j) % 400 for j in range(4 + (wave * 7 + i * 5) % 36)]
            for i in range(batch)]


def _generate_batch(port: int, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    from tests.live import live_util as lu

    body = {"input_ids": prompts, "sampling_params": {
        "max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
    status, text = lu.post(port, "/generate", body, timeout_s=300)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {text[:500]}")
    out = json.loads(text)
    return out if isinstance(out, list) else [out]


def _flush(port: int) -> None:
    from tests.live import live_util as lu

    lu.wait_idle(port)
    status, text = lu.post(port, "/flush_cache", {})
    if status != 200:
        raise RuntimeError(f"/flush_cache answered {status}: {text[:300]}")


# ------------------------------------------------------------------ servers
def _server(mode: str, model: Path, work: Path, threads: int):
    """A (not yet started) server in ``mode`` (``off``/``off2`` or a level) with the timer."""
    from tests.live import live_util as lu

    d = work / mode
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("steps-*.json"):
        old.unlink()
    port = lu.free_port()
    server = [str(lu.VENV_BIN / "python"), "-m", "sglang.launch_server", "--model-path", str(model),
              "--port", str(port), *lu.BASE_FLAGS, *EXTRA_FLAGS]
    argv = server if mode.startswith("off") else [
        str(lu.VENV_BIN / "kvtrace"), "launch", "--out", str(d / "trace"), "--detail", mode,
        "--force", "--", *server]
    env = lu.stub_env()
    rest = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and Path(p) != lu.STUBS_DIR]
    env["PYTHONPATH"] = os.pathsep.join([str(TIMER_DIR), *rest])  # the timer runs the stubs
    env["BENCH_LIVE_STEP_TIMER"] = str(d)
    if threads:  # torch's intra-op threads: with several, the scheduler thread's CPU time
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)  # counts their spin-waits
    return lu.LiveServer(argv, env, port, d / "server.log"), d


def _start_all(servers: dict) -> None:
    """Start every server at once (their start-ups overlap) and wait until each is healthy."""
    import threading

    errors: dict = {}

    def start(mode, srv):
        try:
            srv.start()
        except Exception as e:  # (reported below, after every start-up has ended)
            errors[mode] = e

    ts = [threading.Thread(target=start, args=(m, srv)) for m, (srv, _d) in servers.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        mode, e = next(iter(errors.items()))
        raise RuntimeError(f"server {mode} did not start: {e}")


def _collect(mode: str, srv, d: Path) -> dict:
    """The timer's dump of the measured part (written at the second ``/flush_cache``)."""
    deadline = time.monotonic() + 30
    dumps = sorted(d.glob("steps-*-1.json"))
    while not dumps and time.monotonic() < deadline:
        time.sleep(0.2)
        dumps = sorted(d.glob("steps-*-1.json"))
    if len(dumps) != 1:
        raise RuntimeError(f"{mode}: expected one scheduler timer dump in {d}, found "
                           f"{[p.name for p in dumps]}; log tail:\n{srv.tail()}")
    return json.loads(dumps[0].read_text())


def run_modes(modes: list[str], model: Path, work: Path, *, waves: int, batch: int,
              new_tokens: int, threads: int = 1) -> dict:
    """Start one server per mode (all up at once, idle ones asleep), send each the same waves,
    interleaved: wave ``w`` goes to every server in turn (the order rotated each wave), so a
    change of the machine's load falls on every mode alike. Returns {mode: run}."""
    servers = {m: _server(m, model, work, threads) for m in modes}
    try:
        _start_all(servers)
        for srv, _d in servers.values():
            _generate_batch(srv.port, wave_prompts(99, batch), new_tokens)  # warm-up
            _flush(srv.port)
        sent = {m: 0 for m in modes}
        busy_s = {m: 0.0 for m in modes}
        for w in range(waves):
            for i in range(len(modes)):
                m = modes[(w + i) % len(modes)]
                t0 = time.monotonic()
                sent[m] += len(_generate_batch(servers[m][0].port, wave_prompts(w, batch), new_tokens))
                busy_s[m] += time.monotonic() - t0
        runs = {}
        for m, (srv, d) in servers.items():
            _flush(srv.port)
            data = _collect(m, srv, d)
            runs[m] = {"mode": m, "rows": data["rows"], "meta": data["meta"],
                       "start_s": srv.start_s, "requests": sent[m], "requests_s": busy_s[m]}
        for srv, _d in servers.values():
            srv.signal(signal.SIGTERM)
        for srv, _d in servers.values():
            try:
                srv.wait(60)
            except Exception:
                pass
        return runs
    finally:
        for srv, _d in servers.values():
            srv.kill_tree()


# ------------------------------------------------------------------ comparison
def _groups(rows: list, sched: bool) -> dict:
    """{(mode, batch size, tokens // 64): [iteration CPU us]} (``sched``: minus the forward)."""
    g: dict = {}
    for cpu, _wall, fwd, mode, bs, tokens in rows:
        g.setdefault((mode, bs, tokens // 64), []).append(((cpu - fwd) if sched else cpu) / 1e3)
    return g


def excess(base_rows: list, rows: list, *, min_group: int = 3, sched: bool = False) -> dict:
    """Per-group excess of ``rows`` over ``base_rows`` (us per step), weighted by ``rows``'s
    group counts, over groups with at least ``min_group`` iterations in both."""
    gb, gh = _groups(base_rows, sched), _groups(rows, sched)
    tot = {"min": 0.0, "median": 0.0, "mean": 0.0}
    n = 0
    for key, h in gh.items():
        b = gb.get(key, [])
        if len(h) < min_group or len(b) < min_group:
            continue
        tot["min"] += len(h) * (min(h) - min(b))
        tot["median"] += len(h) * (statistics.median(h) - statistics.median(b))
        tot["mean"] += len(h) * (statistics.fmean(h) - statistics.fmean(b))
        n += len(h)
    out = {k: (round(v / n, 2) if n else None) for k, v in tot.items()}
    out["steps_compared"] = n
    return out


def paired(base_rows: list, rows: list, *, sched: bool = True) -> float | None:
    """Median over steps of (``rows`` step i minus ``base_rows`` step i), in us, when both runs
    ran the same sequence of batches (mode, batch size, tokens), else None. The runs are
    interleaved wave by wave, so step i of each ran within seconds of the other."""
    if [r[3:] for r in base_rows] != [r[3:] for r in rows] or not rows:
        return None
    diffs = [((h[0] - (h[2] if sched else 0)) - (b[0] - (b[2] if sched else 0))) / 1e3
             for b, h in zip(base_rows, rows)]
    return round(statistics.median(diffs), 2)


def _summary(base: dict, run: dict, noise: dict, server_step_us: float, min_group: int) -> dict:
    full = excess(base["rows"], run["rows"], min_group=min_group)
    sched = excess(base["rows"], run["rows"], min_group=min_group, sched=True)
    none = {"min": None, "median": None, "mean": None}
    nf = excess(base["rows"], noise["rows"], min_group=min_group) if noise else none
    ns = excess(base["rows"], noise["rows"], min_group=min_group, sched=True) if noise else none
    out = {
        "us_per_step": full["min"], "us_per_step_median": full["median"],
        "us_per_step_mean": full["mean"],
        "us_per_step_sched": sched["min"], "us_per_step_median_sched": sched["median"],
        "us_per_step_mean_sched": sched["mean"],
        "noise_us_per_step": nf["min"], "noise_us_per_step_median": nf["median"],
        "noise_us_per_step_mean": nf["mean"], "noise_us_per_step_sched": ns["min"],
        "noise_us_per_step_median_sched": ns["median"],
        "us_per_step_paired_sched": paired(base["rows"], run["rows"]),
        "noise_us_per_step_paired_sched": paired(base["rows"], noise["rows"]) if noise else None,
        "pct_of_server_step": (round(100 * full["min"] / server_step_us, 3)
                               if full["min"] is not None and server_step_us else None),
        "steps": len(run["rows"]), "steps_compared": full["steps_compared"],
    }
    out.update(_facts(run))
    return out


def _facts(run: dict) -> dict:
    modes: dict = {}
    for r in run["rows"]:
        name = MODE_NAMES.get(r[3], str(r[3]))
        modes[name] = modes.get(name, 0) + 1
    return {"step_modes": modes, "idle_iterations": run["meta"]["idle_n"],
            "requests": run["requests"], "requests_s": round(run["requests_s"], 2),
            "start_s": round(run["start_s"], 1),
            "kvtrace_recording": run["meta"]["kvtrace_recording"]}


def measure_live(levels=LEVELS, *, waves: int = 12, batch: int = 8, new_tokens: int = 32,
                 min_group: int = 3, noise: bool = True, threads: int = 1,
                 work: Path | None = None) -> dict:
    """Run the modes (``off``, each level, ``off2`` when ``noise``) and compare; see the module
    docstring for the keys. ``work``: where logs, traces and timer dumps go (default: a
    temporary directory, removed)."""
    from tests.live import live_util as lu

    bad = [x for x in levels if x not in LEVELS]
    if bad:
        raise ValueError(f"unknown level(s) {bad}; choose from {', '.join(LEVELS)}")
    for name, v, lo in (("waves", waves, 1), ("batch", batch, 1), ("new_tokens", new_tokens, 1),
                        ("min_group", min_group, 1), ("threads", threads, 0)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r}: expected a whole number >= {lo}")
    if work is not None and work.exists() and not work.is_dir():
        raise ValueError(f"--work {work}: a file is there, expected a directory")
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="kvtrace-live-bench-")
        work = Path(tmp.name)
    try:
        t0 = time.monotonic()
        model = lu.write_llama(Path(work) / "model")
        modes = ["off", *levels] + (["off2"] if noise else [])
        runs = run_modes(modes, model, Path(work), waves=waves, batch=batch,
                         new_tokens=new_tokens, threads=threads)
        base = runs["off"]
        walls = [r[1] / 1e3 for r in base["rows"]]
        cpus = [r[0] / 1e3 for r in base["rows"]]
        step_us = statistics.median(walls) if walls else None
        ref = runs.get("off2")  # the noise floor: hooks off again
        out = {
            "server_step_us": round(step_us, 1) if step_us else None,
            "server_step_cpu_us": round(statistics.median(cpus), 1) if cpus else None,
            "server_forward_cpu_us": round(statistics.median(r[2] / 1e3 for r in base["rows"]), 1)
            if cpus else None,
            "off": _facts(base) | {"steps": len(base["rows"])},
            "levels": {lv: _summary(base, runs[lv], ref, step_us, min_group) for lv in levels},
            "settings": {"waves": waves, "batch": batch, "new_tokens": new_tokens,
                         "min_group": min_group, "torch_threads": threads or "sglang default",
                         "group_key": "(forward mode, batch size, tokens // 64)",
                         "clock": "scheduler thread CPU (time.thread_time_ns) per event-loop iteration"},
            "load_before": list(os.getloadavg()),
        }
        if noise:
            out["noise"] = _summary(base, runs["off2"], runs["off2"], step_us, min_group)
        out["wall_s"] = round(time.monotonic() - t0, 1)
        return out
    finally:
        if tmp is not None:
            tmp.cleanup()


def _table(res: dict) -> str:
    lines = [f"server step (off, median busy iteration): {res['server_step_us']} us wall, "
             f"{res['server_step_cpu_us']} us scheduler-thread CPU "
             f"({res['server_forward_cpu_us']} us of it the model forward)",
             "us per step over hooks off (noise: off2 over off)",
             f"{'level':<8}{'min':>9}{'median':>9}{'mean':>9}{'sch.min':>9}{'sch.med':>9}"
             f"{'paired':>9}{'% step':>9}{'steps':>7}"]
    cols = ("us_per_step", "us_per_step_median", "us_per_step_mean", "us_per_step_sched",
            "us_per_step_median_sched", "us_per_step_paired_sched", "pct_of_server_step")
    rows = list(res["levels"].items())
    if "noise" in res:
        rows.append(("noise", res["noise"]))
    for lv, r in rows:
        lines.append(f"{lv:<8}" + "".join(f"{r[c]!s:>9}" for c in cols) + f"{r['steps']:>7}")
    lines.append(f"load before: {[round(x, 1) for x in res['load_before']]}, total {res['wall_s']} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default=",".join(LEVELS), help="comma-separated capture levels")
    ap.add_argument("--waves", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--min-group", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the server (0: leave sglang's default)")
    ap.add_argument("--no-noise", action="store_true", help="skip the second hooks-off run")
    ap.add_argument("--work", type=Path, help="keep logs, traces and timer dumps here")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    levels = tuple(x for x in a.levels.split(",") if x)
    # SIGTERM ends the run like Ctrl-C: the servers started so far are stopped (run_modes' finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = measure_live(levels, waves=a.waves, batch=a.batch, new_tokens=a.new_tokens,
                           min_group=a.min_group, noise=not a.no_noise, threads=a.threads,
                           work=a.work)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the servers started were stopped; nothing measured", file=sys.stderr)
        return 130
    print(json.dumps(res, indent=1) if a.json else _table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
