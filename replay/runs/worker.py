"""One sweep run in its own process: ``python -m replay.runs.worker JOB.json``, or a child forked
by the sweep's zygote (:mod:`replay.runs.zygote`), which calls :func:`run_job` directly.

``JOB.json`` (written by :func:`replay.runs.pool.run_local`) names the source, sweep root,
policy, grid point, overrides, backend and detail; the result (``{"run", "status", "error",
"timing"}``) goes to ``JOB.result.json`` next to it. Patches and tracer hooks live and die with
this process.

``timing`` tells where a run's process spent its time: ``import_s`` (the backend's imports; about
0 in a child forked from a warm zygote), ``replay_s`` (:func:`replay.runs.replay_run`: the run
and its summary figures), ``record_s`` (the run alone, the summary's ``wall_s``), ``write_s``
(summary and rename), ``cpu_s`` (this process's CPU after its start or fork) and ``new_modules``
(modules the run still had to import).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from replay.procs import caller_ignores_sigint

#: sglang modules a run of the real backend imports (lazily, inside ``record_run``): a warm
#: zygote imports them once so its children do not. A name sglang lacks is skipped.
SGLANG_MODULES = (
    "sglang.srt.managers.scheduler", "sglang.srt.managers.schedule_batch", "sglang.srt.managers.schedule_policy",
    "sglang.srt.managers.io_struct", "sglang.srt.managers.utils",
    "sglang.srt.managers.scheduler_components.pool_stats_observer",
    "sglang.srt.managers.scheduler_components.new_token_ratio_tracker",
    "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.allocator.swa", "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.swa_memory_pool", "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.components.swa", "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.mem_cache.cache_init_params", "sglang.srt.mem_cache.common", "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.server_args", "sglang.srt.sampling.sampling_params", "sglang.srt.speculative.spec_info",
    "sglang.srt.distributed", "sglang.srt.layers.dp_attention", "sglang.srt.runtime_context",
)


def preload(backend: str = "sglang") -> list[str]:
    """Import what a run of ``backend`` needs before its first step; returns the names skipped.

    Imports only: no patch is applied and no tracer hook installed (:func:`record_run` does that
    in the run's own process), so a zygote that called this still forks pristine children.
    """
    import importlib

    from replay.runs.replay import backend_module

    importlib.import_module("replay.runs.metrics")
    importlib.import_module("replay.runs.jobs")  # the run's own module, before the fork

    backend_module(backend)
    skipped: list[str] = []
    if backend == "sglang":
        from replay.backends.sglang.env import bootstrap

        bootstrap()
        for name in ("replay.backends.sglang.build", "replay.backends.sglang.patches",
                     *SGLANG_MODULES):
            try:
                importlib.import_module(name)
            except ImportError:
                skipped.append(name)
    return skipped


#: the most page keys the zygote keeps over all page sizes (a list entry and an int each, ~40 B:
#: ~1.3 GB); a page size whose keys would pass it is left to the runs (production_1h: 16.2 M at
#: page size 16, 259 M at page size 1)
MAX_WARM_PAGES = 32_000_000


def warm(source: str, page_sizes, workers: int = 1, max_pages: int | None = None, scratch: str | None = None
         ) -> dict:
    """Read ``source`` once and key its requests at each of ``page_sizes``, kept in this process
    (``replay.workloads.preload_workload``, :mod:`replay.backends.reference.keytable`): a sweep's
    zygote calls it before it forks the runs of the reference backend, which then neither read
    the workload nor compute a page key again; ``workers``: processes keying the requests
    (``keytable.build``, through ``scratch``). Page sizes whose keys would take the total past ``max_pages``
    (:data:`MAX_WARM_PAGES`) are skipped, smallest count first kept. Returns what it kept (for
    ``zygote.json``)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    from replay.backends.reference import keytable
    from replay.workloads import preload_workload

    limit = MAX_WARM_PAGES if max_pages is None else max_pages
    wl = preload_workload(source)
    pages, kept, skipped = 0, [], []
    for ps in sorted({int(p) for p in page_sizes}, reverse=True):  # fewest keys first
        if pages + keytable.planned_pages(wl, ps) > limit:
            skipped.append(ps)
            continue
        table = keytable.build(wl, ps, workers=workers, scratch=scratch)
        keytable.install(wl, table)
        pages += table.pages
        kept.append(ps)
    return {"source": str(source), "requests": len(wl.requests), "page_sizes": sorted(kept),
            "skipped_page_sizes": sorted(skipped), "workers": workers, "pages": pages,
            "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - cpu0, 3)}


def run_job(job: Path, *, t0: float | None = None, cpu0: float | None = None) -> int:
    """Run the job file ``job``; write its result next to it. Returns the process exit status.

    Args:
        job: the ``JOB.json`` written by the sweep.
        t0, cpu0: ``perf_counter``/``process_time`` at this process's start (or fork); now if None.
    Returns:
        0 (run complete), 1 (run failed, reported in the result), 130 (interrupted; no result).
    """
    t0 = time.perf_counter() if t0 is None else t0
    cpu0 = time.process_time() if cpu0 is None else cpu0
    spec_data = json.loads(Path(job).read_text())
    backend = spec_data["backend"]
    modules = len(sys.modules)
    try:
        try:
            preload(backend)
        except Exception:  # noqa: BLE001 - the run meets the same error and reports it as its failure
            pass
        t_import = time.perf_counter()
        modules_run = len(sys.modules)
        from replay.runs.jobs import RunSpec
        from replay.runs.jobs import run_one as _run_one

        spec = RunSpec(spec_data["policy"], tuple((k, v) for k, v in spec_data["grid"]),
                       spec_data.get("code", ""), spec_data.get("code_spec", ""))
        res = _run_one(spec_data["source"], spec_data["root"], spec, tuple(spec_data["sets"]), backend,
                       spec_data["detail"])
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # Interrupted (a KvtraceError) from replay_run
        print(f"kvtrace worker: {e}", file=sys.stderr)
        return 130
    timing = res.setdefault("timing", {})
    timing |= {"import_s": round(t_import - t0, 3), "cpu_s": round(time.process_time() - cpu0, 3),
               "new_modules": len(sys.modules) - modules_run, "preloaded_modules": modules_run - modules}
    Path(job).with_suffix("").with_suffix(".result.json").write_text(json.dumps(res))
    return 0 if res["status"] == "ok" else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m replay.runs.worker JOB.json``: a cold process per run (deaf to SIGINT when
    the sweep is: ``replay.procs.sigint_env``)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    if caller_ignores_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return run_job(Path((argv or sys.argv[1:])[0]), t0=t0, cpu0=cpu0)


if __name__ == "__main__":
    raise SystemExit(main())
