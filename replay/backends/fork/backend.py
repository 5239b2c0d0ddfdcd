"""The fork's replay backend: a workload through the fork's own Scheduler, recorded by the fork hooks.

Runs in the code's own process (``replay.codes.call_in_code(code,
"replay.backends.fork.backend:record", {...})``; :mod:`replay.runs.code` is the caller). No
behaviour patch: each commit of the fork is its own behaviour. What this module adds to
:mod:`replay.backends.fork.driver` (A's stepping loop) is what a *run* needs:

- the workload's requests with the same token ids the 0.5.23 backend synthesizes
  (:class:`replay.backends.sglang.tokens.TokenSynth`: shared page hashes are shared prefixes, a
  session's next turn extends the previous turn's output), so runs of two codes are comparable;
- the virtual clock of :mod:`replay.backends.base` (``step_fixed_ns + step_per_token_ns *
  tokens``), arrivals by ``arrival_ns``, idle steps jumping to the next arrival;
- the tracer hooks installed by ``tracer.sglang.install`` (which recognizes the fork's target by
  its code and installs ``tracer.sglang.hooks.fork``), the recording lifecycle of
  :func:`replay.backends.base.record_trace`; the hooks' step boundary is the top of the fork's
  ``get_next_batch_to_run()``, as on a server.

Sizes come from knob values (:func:`server_kwargs`): ``full_pool_tokens`` -> ``max_total_tokens``,
the SWA pool through ``swa_full_tokens_ratio``, ``page_size``, ``chunked_prefill_size``,
``max_prefill_tokens``, ``max_running_requests``, ``host_pool_tokens`` (HiCache, via
``hicache_ratio``), ``hicache_write_policy``, ``schedule_policy``, ``eviction_policy``
(``radix_eviction_policy``). The model is ``KVTRACE_FORK_MODEL`` (``dsv4``, ``swa``, ``mha``),
else ``dsv4`` for a DSV4 capture, ``swa`` when the window is > 0, else ``mha``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from replay.backends.dsv4 import DSV4_PAGE_SIZE, DSV4_SWA_FULL_TOKENS_RATIO

#: the tiny configs' end-of-sequence id (``dsv4_pools``); TokenSynth's EOS (0) maps to it.
MODEL_EOS = 1


def detect_target(sglang_dir: str | Path | None = None):
    """The target of the sglang source at ``sglang_dir`` (default: what this interpreter imports),
    from its files only (``tracer.sglang.targets.detect``; nothing is imported)."""
    from tracer.sglang.targets import detect

    return detect(sglang_dir)


def model_kind(settings: dict, manifest: dict | None = None) -> str:
    """``KVTRACE_FORK_MODEL``, else dsv4 for a DSV4 capture, swa with a window, else mha."""
    forced = os.environ.get("KVTRACE_FORK_MODEL", "").strip()
    if forced:
        if forced not in ("dsv4", "swa", "mha"):
            raise ValueError(f"KVTRACE_FORK_MODEL={forced!r}: expected dsv4, swa or mha")
        return forced
    if settings.get("kv_stack") == "dsv4" or (manifest and is_dsv4_manifest(manifest)):
        return "dsv4"
    return "swa" if int(settings["sliding_window_tokens"]) > 0 else "mha"


def is_dsv4_manifest(manifest: dict) -> bool:
    """A capture from a DeepSeek-V4 model, as far as the manifest alone says (its run's ``kv_stack``,
    its model name); the rank files' ``dsv4`` facts are read by :func:`replay.backends.dsv4.is_dsv4`,
    which the run's settings (``kv_stack``) come from."""
    run = (manifest.get("run") or {}).get("settings") or {}
    if "kv_stack" in run:
        return run["kv_stack"] == "dsv4"
    model = str((manifest.get("server") or {}).get("model", "")).lower().replace("-", "_")
    return any(s in model for s in ("deepseek_v4", "deepseekv4", "dsv4"))


def server_kwargs(settings: dict, kind: str, *, context_length: int) -> dict:
    """Keyword arguments of :func:`replay.backends.fork.dsv4_pools.make_server_args` from knob values."""
    full = int(settings["full_pool_tokens"])
    ps = int(settings["page_size"])
    kw = dict(page_size=None if kind == "dsv4" else ps, max_total_tokens=full,
              max_running_requests=int(settings["max_running_requests"]),
              chunked_prefill_size=int(settings["chunked_prefill_size"]),
              max_prefill_tokens=int(settings["max_prefill_tokens"]), context_length=int(context_length),
              hicache_host_tokens=int(settings["host_pool_tokens"]),
              schedule_policy=str(settings["schedule_policy"]),
              radix_eviction_policy=str(settings["eviction_policy"]))
    if settings["host_pool_tokens"]:
        kw["hicache_write_policy"] = str(settings["hicache_write_policy"])
    if kind != "mha":
        swa = int(settings.get("swa_pool_tokens") or 0)
        if swa and kind == "dsv4":
            # the configurator floors int(full * ratio) to pages: half a page above lands on swa exactly
            kw["swa_full_tokens_ratio"] = (swa + DSV4_PAGE_SIZE / 2) / full
        else:
            kw["swa_full_tokens_ratio"] = (swa / full) if swa else float(settings["swa_full_tokens_ratio"])
    if kind == "dsv4" and settings["host_pool_tokens"]:
        # DSV4's host pools are max(int(device pages * --hicache-ratio), pages + 1) each (full and
        # SWA, one ratio): the ratio that rebuilds the recorded host sizes (replay.backends.dsv4)
        from replay.backends.dsv4 import device_pool_tokens, hicache_ratio_for

        ratio = kw.get("swa_full_tokens_ratio", DSV4_SWA_FULL_TOKENS_RATIO)
        dev_full, dev_swa = device_pool_tokens(full, ratio)
        kw["hicache_ratio"] = hicache_ratio_for(dev_full, dev_swa, int(settings["host_pool_tokens"]),
                                                int(settings.get("host_swa_pool_tokens") or 0))
    return kw


_UNSCHEDULABLE_AFTER_IDLE_STEPS = 3


def _abort_unschedulable(req) -> None:
    """Mark ``req`` (never admitted, no KV) aborted and write its finish row, as the 0.5.23
    backend does for a request its pools never admit."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from tracer.sglang.runtime import requests, state

    req.finished_reason = FINISH_ABORT("admission refuses it with the pools idle")
    requests.emit_finish(req, state.rid_of(req))


class _Sink:
    """The scheduler's ZMQ sockets: keeps the ``AbortReq`` of requests it ends, counts the rest."""

    def __init__(self) -> None:
        self.aborts: list = []
        self.sent = 0

    def send_pyobj(self, obj, *args, **kwargs) -> None:
        self.sent += 1
        if type(obj).__name__ == "AbortReq" and not getattr(obj, "abort_all", False):
            self.aborts.append(obj)


class ForkBackend:
    """The fork's Scheduler stepped over a workload on the virtual clock (see the module doc).

    ``run(observer)`` returns a :class:`replay.backends.base.RunResult`.
    """

    def __init__(self, workload, settings: dict, kind: str) -> None:
        from replay.backends.sglang.tokens import TokenSynth

        self.workload, self.settings, self.kind = workload, settings, kind
        self.synth = TokenSynth(workload)
        self.pending = list(workload.requests)
        self.plans: dict[str, list[int]] = {}
        self.wreqs: dict = {}
        self.reqs: dict = {}
        block = int(settings["page_size"]) if kind != "dsv4" else 256
        longest = max((w.input_len + w.max_new_tokens for w in self.pending), default=1) + 1
        ctx = int(settings.get("max_context_tokens") or 0) or longest
        self.context_length = -(-ctx // block) * block + block

    # ------------------------------------------------------------------ build
    def build(self):
        from replay.backends.fork.scheduler import build_scheduler

        s = self.settings
        self.server_args, sched = build_scheduler(
            self.kind, sliding_window_tokens=int(s["sliding_window_tokens"]) or 128, next_token=self._next_token,
            **server_kwargs(s, self.kind, context_length=self.context_length))
        sched.model_config.vocab_size = 1 << 31  # synthesized ids; nothing is sampled from a model
        self.sink = _Sink()
        for name in ("send_to_tokenizer", "send_to_detokenizer"):
            getattr(sched.ipc_channels, name).socket = self.sink
        import logging

        logging.getLogger("sglang").setLevel(logging.WARNING)
        self.sched = sched
        return sched

    def _next_token(self, req) -> int:
        plan = self.plans[req.rid]
        n = len(req.output_ids)
        tok = plan[n] if n < len(plan) else 0
        return MODEL_EOS if tok == 0 else (tok if tok != MODEL_EOS else 2)

    def _tokenized(self, wreq):
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=int(wreq.max_new_tokens), temperature=0.0)
        sp.normalize(None)
        return TokenizedGenerateReqInput(rid=str(wreq.rid), input_text="", input_ids=self.synth.prompt_ids(wreq),
                                         mm_inputs=None, sampling_params=sp, return_logprob=False,
                                         logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None,
                                         stream=False)

    # ------------------------------------------------------------------ loop
    def run(self, observer):
        import torch

        from replay.backends.base import RunResult, StepRecord

        sched = self.sched
        s = self.settings
        fixed, per_token = int(s["step_fixed_ns"]), int(s["step_per_token_ns"])
        res = RunResult(settings=dict(s), num_requests=len(self.pending))
        clock = self.pending[0].arrival_ns if self.pending else 0
        cursor, forward_ct, idle_streak = 0, 0, 0
        reporter = getattr(sched, "metrics_reporter", None)

        def complete(rid: str, req, reason: str) -> None:
            wreq = self.wreqs.pop(rid)
            if reason == "finished":
                res.num_finished += 1
                res.cached_tokens += int(getattr(req, "cached_tokens", 0) or 0)
            else:
                res.num_aborted += 1
            observer.on_finish(wreq, req, clock, reason)

        with torch.no_grad():
            while cursor < len(self.pending) or self.wreqs:
                t0 = time.perf_counter_ns()
                observer.on_step_begin(clock)
                inputs = []
                while cursor < len(self.pending) and self.pending[cursor].arrival_ns <= clock:
                    w = self.pending[cursor]
                    cursor += 1
                    observer.on_arrival(w, clock)
                    self.wreqs[str(w.rid)] = w
                    self.plans[str(w.rid)] = self.synth.output_ids(w)
                    inputs.append(self._tokenized(w))
                if inputs:
                    before = len(sched.waiting_queue)
                    sched.process_input_requests(inputs)
                    for r in sched.waiting_queue[before:]:
                        # The arrival row is written (Req.__init__) from the DeclaredPrompt; the
                        # fork's Req concatenates origin_input_ids with lists: give it a list.
                        ids = list(r.origin_input_ids)
                        if r.origin_input_ids_unpadded is r.origin_input_ids:
                            r.origin_input_ids_unpadded = ids
                        r.origin_input_ids = ids
                        self.reqs[r.rid] = r
                    for i in inputs:  # refused at arrival (too long for the row or the pools)
                        if i.rid not in self.reqs:
                            complete(i.rid, None, "too_long")
                if reporter is not None:
                    reporter.num_retracted_reqs = 0
                batch = sched.get_next_batch_to_run()
                retracted = int(getattr(reporter, "num_retracted_reqs", 0) or 0)
                res.num_retractions += retracted
                if batch is None:
                    sched.on_idle()
                    if cursor < len(self.pending):
                        clock = max(clock, self.pending[cursor].arrival_ns)
                    else:
                        idle_streak += 1
                        if (sched.waiting_queue and sched.running_batch.is_empty() and sched.chunked_req is None
                                and idle_streak >= _UNSCHEDULABLE_AFTER_IDLE_STEPS):
                            # Nothing runs, nothing will arrive, and the head is still refused (as
                            # the 0.5.23 backend: a request these pools never admit). Aborted so
                            # the run ends; it holds no KV.
                            idle_streak = 0
                            req = sched.waiting_queue.pop(0)
                            self.reqs.pop(req.rid, None)
                            _abort_unschedulable(req)
                            complete(req.rid, req, "unschedulable")
                        elif idle_streak > 1000:
                            raise RuntimeError(f"fork backend stalled at step {forward_ct}: "
                                               f"{len(sched.waiting_queue)} waiting, nothing runs")
                    record = StepRecord(forward_ct, "idle", 0, 0, 0, clock, retracted)
                else:
                    idle_streak = 0
                    extend = batch.forward_mode.is_extend()
                    n_tok = int(batch.extend_num_tokens) if extend else batch.batch_size()
                    step_ns = fixed + per_token * n_tok
                    clock += step_ns
                    result = sched.run_batch(batch)
                    sched.process_batch_result(batch, result)
                    if extend:
                        res.num_prefill_steps += 1
                        res.prefill_tokens += n_tok
                    else:
                        res.num_decode_steps += 1
                        res.decode_tokens += n_tok
                    res.num_steps += 1
                    res.clock_ns = clock
                    record = StepRecord(forward_ct, "prefill" if extend else "decode", batch.batch_size(), n_tok,
                                        step_ns, clock, retracted)
                sched.last_batch = batch
                self.last_batch = batch
                if batch is not None:
                    for req in batch.reqs:
                        if req.rid in self.reqs and req.finished():
                            del self.reqs[req.rid]
                            aborted = type(req.finished_reason).__name__ == "FINISH_ABORT"
                            complete(req.rid, req, "retract_oom" if aborted else "finished")
                for abort in self.sink.aborts:  # ended by the Scheduler without a finish
                    req = self.reqs.pop(abort.rid, None)
                    if abort.rid in self.wreqs:
                        complete(abort.rid, req, "retract_oom")
                self.sink.aborts.clear()
                forward_ct += 1
                import dataclasses

                observer.on_step(dataclasses.replace(record, cpu_ns=time.perf_counter_ns() - t0), self)
            # the boundary that closes the last step: one more iteration with nothing to run
            if sched.get_next_batch_to_run() is not None:
                raise RuntimeError("fork backend: the Scheduler selected a batch after the run finished")
            sched.last_batch = None
        res.clock_ns = clock
        return res


def built_capacities(sched) -> dict:
    """The pool sizes the fork built (manifest ``server`` keys): full, SWA, and with HiCache the
    host anchor (``host_pool_tokens``) and the SWA host pool (``host_swa_pool_tokens``)."""
    alloc = sched.token_to_kv_pool_allocator
    out = {"full_pool_tokens": int(getattr(alloc, "size_full", getattr(alloc, "size", 0)))}
    if hasattr(alloc, "size_swa"):
        out["swa_pool_tokens"] = int(alloc.size_swa)
    out["host_pool_tokens"] = 0
    host = getattr(getattr(sched.tree_cache, "cache_controller", None), "mem_pool_host", None)
    if host is None:
        return out
    anchor = getattr(host, "anchor_entry", None)
    out["host_pool_tokens"] = int(getattr(anchor.host_pool if anchor is not None else host, "size", 0))
    for entry in getattr(host, "entries", None) or []:
        if str(getattr(entry, "name", "")).lower().endswith("swa"):
            out["host_swa_pool_tokens"] = int(entry.host_pool.size)
    return out


def _observer_cls():
    from replay.backends.base import RunObserver

    class _Observer(RunObserver):
        key = str

        def batch_of(self, backend):
            return backend.last_batch.reqs

    return _Observer


def record(source: str, out: str, settings: dict, *, detail: str = "counts", manifest_extra: dict | None = None,
           progress_file: str | None = None) -> dict:
    """Replay ``source`` on this process's code into the trace ``out`` (entry point for ``call_in_code``).

    Returns:
        JSON: ``result``, ``times`` (rid -> request times), ``sched_cpu_ns``, ``wall_ns``,
        ``first_arrival_ns``, ``hook_failures``, ``target`` (the detection), ``coverage``,
        ``kind``, ``pools``, ``sglang_file``.
    Raises:
        UnsupportedSglang: the code is no known target (its hooks would not cover it).
    """
    import dataclasses

    import tracer.sglang
    from tracer.schema.manifest import read_manifest
    from tracer.sglang import targets
    from tracer.sglang.runtime import state as hook_state

    from replay.backends.base import record_trace
    from replay.workloads import read_workload

    wl = read_workload(source)
    kind = model_kind(settings, read_manifest(Path(source)))
    det = targets.detect()
    tracer.sglang.install(detail=detail)
    cadence = tracer.sglang.configure()
    tracer.sglang.configure(stats_interval_ms=0)
    hook_state.new_trace()
    before = dict(tracer.sglang.failures)
    backend = ForkBackend(wl, settings, kind)
    backend.build()
    tracer.sglang.install(check=False, lazy=True)  # the Scheduler module is imported now: wrap it
    prog = _ProgressFile(progress_file, len(wl.requests))
    server = {"page_size": int(backend.server_args.page_size),
              "sliding_window_tokens": int(settings["sliding_window_tokens"]) if kind != "mha" else 0,
              "full_pool_tokens": int(settings["full_pool_tokens"]),
              "swa_full_tokens_ratio": float(backend.server_args.swa_full_tokens_ratio),
              **built_capacities(backend.sched),
              "chunked_prefill_size": int(settings["chunked_prefill_size"]),
              "max_prefill_tokens": int(settings["max_prefill_tokens"]),
              "max_running_requests": int(settings["max_running_requests"]),
              "hicache_write_policy": settings["hicache_write_policy"] if settings["host_pool_tokens"] else "",
              "eviction_policy": settings["eviction_policy"], "schedule_policy": settings["schedule_policy"],
              "cache_kind": type(backend.sched.tree_cache).__name__, "model": f"kvtrace-fork-{kind}",
              "sglang_version": det.target_name or ""}
    env = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")}
    try:
        rec = record_trace(wl, out, backend.run, source="fork-backend", server=server, env=env, detail=detail,
                           flush_interval_ms=1000, manifest_extra=manifest_extra, on_progress=prog.update,
                           observer_cls=_observer_cls())
    finally:
        tracer.sglang.configure(**cadence)
    failures = {k: n - before.get(k, 0) for k, n in tracer.sglang.failures.items() if n > before.get(k, 0)}
    from replay.backends.fork.driver import _pools

    pools = _pools(backend.sched)
    from tracer.sglang.hooks import coverage as hook_coverage

    cov = hook_coverage()
    tracer.sglang.uninstall()
    import sglang

    return {"result": dataclasses.asdict(rec.result),
            "times": {str(k): dataclasses.asdict(v) for k, v in rec.times.items()},
            "sched_cpu_ns": rec.sched_cpu_ns, "wall_ns": rec.wall_ns, "first_arrival_ns": rec.first_arrival_ns,
            "hook_failures": failures, "target": det.as_dict(), "coverage": cov, "kind": kind,
            "pools": pools | {"capacities": built_capacities(backend.sched)},
            "sglang_file": sglang.__file__}


class _ProgressFile:
    """Writes ``[done, total, clock_ns]`` to a file at most twice a second (the parent draws the bar)."""

    def __init__(self, path: str | None, total: int) -> None:
        self.path, self.total, self.last = path, total, 0.0

    def update(self, done: int, clock_ns: int) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self.last < 0.5 and done < self.total:
            return
        self.last = now
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump([done, self.total, clock_ns], f)
        os.replace(tmp, self.path)


__all__ = ["ForkBackend", "built_capacities", "detect_target", "is_dsv4_manifest", "model_kind", "record", "server_kwargs"]
