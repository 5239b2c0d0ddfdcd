# kvtrace bench only (bench/live_overhead.py): a per-iteration step timer for the scheduler
# process of a live `python -m sglang.launch_server`, the same in every mode (hooks off or on).
#
# Put this directory (alone, instead of tests/live/stubs) on PYTHONPATH of the server. At
# interpreter start-up it:
#   1. runs tests/live/stubs/sitecustomize.py by path (the import stubs the CPU server needs);
#   2. when BENCH_LIVE_STEP_TIMER names a directory, wraps, when sglang loads them:
#      - Scheduler.ingest_requests (the first call of each event-loop iteration): reads the
#        scheduler thread's CPU time (time.thread_time_ns) and wall time; the difference with
#        the previous read is one iteration, recorded with the batch it ran (forward mode,
#        batch size, tokens) or counted as idle;
#      - Scheduler.run_batch: notes that batch (at entry, before the original runs);
#      - TpModelWorker.forward_batch_generation: its CPU time in that thread (the model
#        forward and sampling, where no kvtrace hook runs), recorded beside the iteration;
#      - Scheduler.flush_cache: writes the iterations recorded since the previous flush to
#        DIR/steps-<pid>-<k>.json (k = 0, 1, ...), then starts afresh; the bench calls
#        /flush_cache after its warm-up (k = 0, discarded) and after its measured requests.
#   It wraps no method kvtrace hooks, so either may wrap first; with `kvtrace launch`, the
#   launch shim (first on PYTHONPATH) chains to this file.
# Standard library only; never breaks interpreter start-up.
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_STUBS = os.path.join(_HERE, "..", "..", "tests", "live", "stubs", "sitecustomize.py")


def _run_stubs():
    path = os.path.abspath(_STUBS)
    code = compile(open(path).read(), path, "exec")
    exec(code, {"__name__": "kvtrace_live_stubs", "__file__": path})


class _Timer:
    """Iterations of one scheduler thread: busy ones as rows, idle ones as a count and a sum."""

    def __init__(self, out_dir):
        self.out_dir, self.k = out_dir, 0
        self.reset()

    def reset(self):
        self.rows = []  # [cpu_ns, wall_ns, forward_cpu_ns, mode, batch_size, tokens]
        self.idle_n = self.idle_cpu_ns = 0
        self.prev_cpu = self.prev_wall = None
        self.batch = None
        self.fwd = 0

    def tick(self):
        c, w = time.thread_time_ns(), time.perf_counter_ns()
        if self.prev_cpu is not None:
            if self.batch is not None:
                self.rows.append([c - self.prev_cpu, w - self.prev_wall, self.fwd, *self.batch])
            else:
                self.idle_n += 1
                self.idle_cpu_ns += c - self.prev_cpu
        self.prev_cpu, self.prev_wall, self.batch, self.fwd = c, w, None, 0

    def note_batch(self, batch):
        try:
            mode = int(batch.forward_mode)
            bs = len(batch.reqs)
            tokens = batch.extend_num_tokens if batch.forward_mode.is_extend() else bs
            self.batch = (mode, bs, int(tokens or 0))
        except Exception:
            self.batch = (-1, 0, 0)

    def dump(self):
        tracer = sys.modules.get("tracer")
        active = getattr(tracer, "active", None)
        meta = {"pid": os.getpid(), "k": self.k, "idle_n": self.idle_n,
                "idle_cpu_ns": self.idle_cpu_ns, "kvtrace_recording": bool(active()) if callable(active) else
                bool(getattr(tracer, "_active", False))}
        path = os.path.join(self.out_dir, "steps-%d-%d.json" % (os.getpid(), self.k))
        with open(path + ".tmp", "w") as f:
            json.dump({"meta": meta, "columns": ["cpu_ns", "wall_ns", "forward_cpu_ns", "mode",
                                                 "batch_size", "tokens"], "rows": self.rows}, f)
        os.replace(path + ".tmp", path)
        self.k += 1
        self.reset()


def _patch_scheduler(timer):
    from sglang.srt.managers.scheduler import Scheduler

    ingest, run_batch, flush = Scheduler.ingest_requests, Scheduler.run_batch, Scheduler.flush_cache
    tick, note = timer.tick, timer.note_batch

    def ingest_requests(self, *args, **kwargs):
        tick()
        return ingest(self, *args, **kwargs)

    def timed_run_batch(self, batch, *args, **kwargs):
        note(batch)
        return run_batch(self, batch, *args, **kwargs)

    def flush_cache(self, *args, **kwargs):
        try:
            timer.dump()
        except Exception as e:
            sys.stderr.write("bench step timer: dump failed: %r\n" % (e,))
        return flush(self, *args, **kwargs)

    Scheduler.ingest_requests = ingest_requests
    Scheduler.run_batch = timed_run_batch
    Scheduler.flush_cache = flush_cache


def _patch_worker(timer):
    from sglang.srt.managers.tp_worker import TpModelWorker

    fwd, tt = TpModelWorker.forward_batch_generation, time.thread_time_ns

    def forward_batch_generation(self, *args, **kwargs):
        c0 = tt()
        try:
            return fwd(self, *args, **kwargs)
        finally:
            timer.fwd += tt() - c0

    TpModelWorker.forward_batch_generation = forward_batch_generation


def _after_import(name, then):
    import importlib.abc

    class _Finder(importlib.abc.MetaPathFinder):
        busy = False  # another finder of this kind (kvtrace's autoload watcher) may ask us back

        def find_spec(self, fullname, path=None, target=None):
            if fullname != name or self.busy:
                return None
            self.busy = True
            try:
                return self._find(fullname, path, target)
            finally:
                self.busy = False

        def _find(self, fullname, path, target):
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is None:
                    continue
                inner = spec.loader

                class _Loader(importlib.abc.Loader):
                    def create_module(self, spec):
                        return inner.create_module(spec)

                    def exec_module(self, module):
                        inner.exec_module(module)
                        try:
                            then()
                        except Exception as e:
                            sys.stderr.write("bench step timer: %s not patched: %r\n" % (name, e))

                spec.loader = _Loader()
                return spec
            return None

    sys.meta_path.insert(0, _Finder())


def _install_timer(out_dir):
    timer = _Timer(out_dir)
    _after_import("sglang.srt.managers.scheduler", lambda: _patch_scheduler(timer))
    _after_import("sglang.srt.managers.tp_worker", lambda: _patch_worker(timer))


try:
    _run_stubs()
except Exception as _e:
    sys.stderr.write("bench step timer: live stubs not run: %r\n" % (_e,))
try:
    if os.environ.get("BENCH_LIVE_STEP_TIMER"):
        _install_timer(os.environ["BENCH_LIVE_STEP_TIMER"])
except Exception as _e:
    sys.stderr.write("bench step timer: not installed: %r\n" % (_e,))
