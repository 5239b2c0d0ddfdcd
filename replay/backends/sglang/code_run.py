"""The real-code backend in a code's own process: an upstream sglang release given as ``--code
sglang==X`` (or a tree of one) replays with this backend against that release's classes, as
the installed 0.5.23 does in-process (issue 24: each code its own process, path overlay and
environment; :mod:`replay.runs.code`).

:func:`record` is the entry point of ``call_in_code`` (the JSON contract of
:func:`replay.backends.fork.backend.record`): the knob values that reach a code (no behaviour
patch: a release is its own behaviour), the workload, the trace to write.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


def record(source: str, out: str, settings: dict, *, detail: str = "counts", manifest_extra: dict | None = None,
           progress_file: str | None = None) -> dict:
    """Replay ``source`` on this process's sglang into the trace ``out`` (see the module doc).

    Returns:
        JSON: ``result``, ``times``, ``sched_cpu_ns``, ``wall_ns``, ``first_arrival_ns``,
        ``hook_failures``, ``target`` (the detection), ``coverage``, ``kind``, ``pools``,
        ``sglang_file``.
    """
    import sglang

    from replay import knobs
    from replay.backends.fork.backend import _ProgressFile
    from replay.backends.sglang.run import record_run, settings_from_knobs
    from replay.backends.sglang.workload import load_workload
    from tracer.sglang import targets
    from tracer.sglang.hooks import coverage as hook_coverage

    det = targets.detect()
    values, _ = knobs.resolve("recorded", (), dict(settings))
    s = settings_from_knobs(values)
    wl = load_workload(source)
    prog = _ProgressFile(progress_file, len(wl.requests))
    rec = record_run(wl, s, out, detail=detail, manifest_extra=manifest_extra, on_progress=prog.update)
    cov = hook_coverage()
    pools = {"full_pool_tokens": s.full_pool_tokens, "swa_pool_tokens": s.swa_pool_tokens,
             "page_size": s.page_size}
    return {"result": dataclasses.asdict(rec.result),
            "times": {str(k): dataclasses.asdict(v) for k, v in rec.times.items()},
            "sched_cpu_ns": rec.sched_cpu_ns, "wall_ns": rec.wall_ns, "first_arrival_ns": rec.first_arrival_ns,
            "hook_failures": rec.hook_failures, "target": det.as_dict(), "coverage": cov, "kind": "upstream",
            "pools": pools, "sglang_file": str(Path(sglang.__file__))}


__all__ = ["record"]
