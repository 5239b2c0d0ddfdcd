"""Real-code backend: runs a workload through the genuine sglang 0.5.23 scheduler and memory code.

    from replay.backends.sglang import SglangBackend, SglangSettings, load_workload
    with SglangBackend(load_workload("data/w1"), SglangSettings(page_size=16)) as be:
        result = be.run()

Modules: ``settings`` (frozen config), ``workload`` (arrival rows), ``tokens`` (token ids from
page hashes), ``build`` (the real objects), ``loop`` (the scheduler loop), ``occupancy`` (the
identity check). The bootstrap is ``replay.backends.sglang.env``; the listed patches are
``replay.backends.sglang.patches``. See docs/sglang.md.
"""

from replay.backends.sglang.loop import LoopObserver, RunResult, SglangBackend, StepRecord, run_backend
from replay.backends.sglang import scheduler as _scheduler  # noqa: F401  (registers scheduler=real)
from replay.backends.sglang.occupancy import PoolOccupancy
from replay.backends.sglang.settings import CHOICES, SglangSettings, from_knobs, parse_overrides, setting_names
from replay.backends.sglang.workload import Workload, WorkloadRequest, load_workload, write_workload

__all__ = [
    "CHOICES", "LoopObserver", "PoolOccupancy", "RunResult", "SglangBackend", "SglangSettings",
    "StepRecord", "Workload", "from_knobs", "WorkloadRequest", "load_workload", "parse_overrides", "run_backend",
    "setting_names", "write_workload",
    "_scheduler",  # imported for its side effect: registers scheduler=real in SCHEDULER_BACKENDS
]
