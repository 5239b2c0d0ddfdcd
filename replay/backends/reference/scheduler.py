"""The reference scheduler: sglang 0.5.23's scheduling loop restated over ``replay.memory``.

Same loop shape, virtual clock and step-cost model as the real backend
(:mod:`replay.backends.sglang.loop`): per step the observer's ``on_step_begin``, arrivals up to
the clock, stash the chunked request (unfinished insert), merge the last prefill batch into the
running batch, prefill admission (:class:`replay.backends.reference.budget.PrefillBudget`:
total/chunk/input/SWA budgets, ``swa_admission``, chunking, host-hit load-back), else decode
(decode-memory check, retraction with the new-token-ratio estimate, out-of-window SWA release every
``swa_eviction_interval_tokens``), the clock advances by ``step_fixed_ns + step_per_token_ns *
tokens``, results (finish: insert + free; prefill done: unfinished insert), one ``stats`` sample.

Every memory effect is emitted through the tracer's API (``tracer.request/sched/cache/stats``), so
a reference run is a schema-v1 trace like a real one; when no recorder runs the emits are no-ops.
No wall clock is read for any decision.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from replay.backends.base import RunResult, StepRecord
from replay.backends.reference.admission import AdmissionMixin
from replay.backends.reference.budget import NewTokenRatio, ceil_page
from replay.backends.reference.coalesce import POOL_IDS as _POOL_IDS, CoalesceMixin
from replay.backends.reference.decode import DecodeMixin
from replay.backends.reference.gc_pace import fewer_collections
from replay.backends.reference import keytable
from replay.backends.reference.keys import KeyDonors, LazyPrompt, SequenceOrigins
from replay.backends.reference.request import EOS_TOKEN_ID, RefReq, output_plan
from replay.backends.reference.settings import ReferenceSettings
from replay.memory import KVCacheModel
from tracer.schema import CacheOp, Mode, RequestEvent, SchedKind
from tracer.schema.prefixes import new_prefix_index

_UNSCHEDULABLE_AFTER_IDLE_STEPS = 3
_STALLED_AFTER_IDLE_STEPS = 1000
_STEP = int(SchedKind.STEP)
_ARRIVAL = int(RequestEvent.ARRIVAL)
_MODE_IDS = {"idle": int(Mode.IDLE), "prefill": int(Mode.PREFILL), "decode": int(Mode.DECODE)}


class ReferenceBackend(AdmissionMixin, DecodeMixin, CoalesceMixin):
    """Runs a workload through the reference scheduler and memory model.

    Args:
        workload: the arrivals (:class:`replay.workloads.Workload`).
        settings: sizes and policies.
        observer: a :class:`replay.backends.base.LoopObserver`.
        check_integrity_every: run :meth:`check_integrity` every N steps (0 = never).
    """

    #: this backend's page keys are chained (:mod:`replay.backends.reference.keys`), so its tree
    #: compares a node key at its last page (``RadixTree.chained_keys``); off only to test that
    #: it is exact
    chained_keys = True

    def __init__(self, workload, settings: ReferenceSettings | None = None, *, observer=None,
                 check_integrity_every: int = 0) -> None:
        self.workload = workload
        self.settings = settings or ReferenceSettings()
        self.observer = observer
        self.check_integrity_every = check_integrity_every

    def __enter__(self) -> ReferenceBackend:
        from replay.backends.sglang.tokens import TokenSynth

        s = self.settings
        self.model = KVCacheModel(s.memory_config())
        if self.model.tree is not None:
            self.model.tree.chained_keys = self.chained_keys
        # ``pool`` rows: every allocator and host pool of the model emits its alloc/free through
        # the tracer (a no-op when not recording), as the real allocators' hooks do; a figures-only
        # run's sink reads only the host pools' (their allocator CPU)
        self._traced = getattr(self.observer, "traced", True)
        pools = self.model.pools
        device = (pools.full, pools.swa) if self._traced else ()
        for alloc in (*device, self.model.host_full, self.model.host_swa):
            if alloc is not None:
                alloc.emit = tracer.pool
        self._synth = TokenSynth(self.workload)
        # each request's page keys: from a table computed before the run (a sweep's zygote's, else
        # this run's own, ``keytable.for_run``), else (a workload past ``MAX_RUN_PAGES`` keys)
        # computed as the run needs them, the leading ones taken from an earlier request; built at
        # the run's collector pace (``gc_pace``: its long-lived lists, no cyclic garbage)
        with fewer_collections():
            self._key_table = keytable.lookup(self.workload, s.page_size) or keytable.for_run(self.workload,
                                                                                            s.page_size)
        self._donors = KeyDonors(self.workload.requests, self._synth._next_turn) if self._key_table is None else None
        self._prefixes = new_prefix_index()  # the arrival rows' storage form (schema 1.1), as the hooks'
        self._pending = list(self.workload.requests)
        self._next_arrival = 0
        self.clock_ns = self._pending[0].arrival_ns if self._pending else 0
        self.forward_ct = 0
        self.trace_ct = 0  # the trace's step number: batch steps written so far (see ``_sample``)
        self._sampled_idle = False
        self.waiting: list[RefReq] = []
        self.running: list[RefReq] = []
        self.last_batch: list[RefReq] | None = None
        self.last_mode = "idle"
        self.chunked_req: RefReq | None = None
        self.batch_is_full = False
        self.ratio = NewTokenRatio()
        self.max_rows = s.max_running_requests
        self._active: dict[int, RefReq] = {}
        self._last_retracted = 0
        self._idle_streak = 0
        self._last_reject: dict[int, tuple] = {}
        self._prefix_refresh_calls = 0
        max_ctx = s.max_context_tokens or (self.workload.max_seq_tokens + 1)
        self._max_req_len = ceil_page(max_ctx, s.page_size) + s.page_size - 1  # the request row width - 1
        self.result = RunResult(settings=s.to_dict(), num_requests=len(self._pending))
        return self

    def __exit__(self, *exc) -> None:
        close = getattr(self._key_table, "close", None)  # a key stream's process (``keystream``)
        if close is not None:
            close()
        return None

    # ---------------------------------------------------------------- public API
    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self._pending) and not self._active

    def run(self) -> RunResult:
        """Step until every request has finished or been aborted (with ``decode_coalescing`` on or auto,
        quiet decode stretches run in one move: :mod:`replay.backends.reference.coalesce`); with
        ``stop_on_retraction=on``, only until the step that retracts or aborts a request first
        (``result.stopped``)."""
        stop = self.settings.stop_on_retraction == "on"
        res = self.result
        stretch = self._run_stretch if self.settings.decode_coalescing != "off" else None  # on, or auto
        with fewer_collections():  # the collector's pace only (``gc_pace``)
            while not self.done:
                if stretch is not None and stretch():  # a stretch never retracts (it stops before a shortfall)
                    continue
                self.step()
                if stop and (res.num_retractions or res.num_aborted):
                    break
        if not self.done:
            res.stopped = "first_retraction"
        self.model.ack_write_through()  # the last acks, as the real loop's ``close_step``
        self.result.final_occupancy = {k: v.__dict__ for k, v in self.model.snapshot().items()}
        return self.result

    def step(self) -> StepRecord:
        """One scheduler iteration; returns its record."""
        t0 = perf_counter_ns()
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        self._admit_arrivals()
        # HiCache write acks where sglang's Scheduler polls them (``check_hicache_events``)
        self.model.ack_write_through()
        batch, mode = self._next_batch()
        if batch is None:
            record = self._idle_step(self._last_retracted)
        else:
            record = self._run_batch(batch, mode, self._last_retracted)
        # the step's own rows are stamped at its end, as the hooks stamp sglang's Scheduler (they
        # sample the pools at the next step's begin, which is this clock)
        tracer.set_clock(self.clock_ns)
        self._sample(record)
        self.forward_ct += 1
        record.cpu_ns = perf_counter_ns() - t0  # the record is this step's own, not yet handed out
        if self.observer is not None:
            self.observer.on_step(record, self)
        if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
            self.check_integrity()
        return record

    def occupancy(self) -> dict:
        """Per-pool capacity/available/evictable/protected/held (tokens)."""
        return self.model.snapshot()

    def check_integrity(self) -> None:
        """Check the model's pools, tree and rows, and the waiting-queue refresh's window (raises
        ``IntegrityError``, an AssertionError)."""
        self.model.check_integrity()
        self._check_refresh_window()

    # ---------------------------------------------------------------- arrivals
    def _admit_arrivals(self) -> None:
        pending, s = self._pending, self.settings
        while self._next_arrival < len(pending) and pending[self._next_arrival].arrival_ns <= self.clock_ns:
            wreq = pending[self._next_arrival]
            self._next_arrival += 1
            if self.observer is not None:
                self.observer.on_arrival(wreq, self.clock_ns)
            synth = self._synth
            table = self._key_table.of(int(wreq.rid)) if self._key_table is not None else None
            req = RefReq(wreq, LazyPrompt(synth, wreq, int(wreq.input_len)), output_plan(wreq), s.page_size,
                         self._max_new_tokens(int(wreq.input_len), int(wreq.max_new_tokens)),
                         SequenceOrigins(synth, wreq) if table is None else None)
            if table is not None:  # its keys computed before the run (no origins needed)
                req.keys.take_from(table)
            elif self._donors is not None:
                self._donors.adopt(req.keys, wreq)
            self._active[req.rid] = req
            # shared prefixes written once, as the hooks write a declared prompt's arrival (a
            # figures-only run's sink reads none of it)
            if self._traced:
                prefix_rid, prefix_blocks, new = self._prefixes.encode(req.rid, wreq.page_hashes, chained=False)
            else:
                prefix_rid, prefix_blocks, new = -1, 0, wreq.page_hashes
            tracer.request(_ARRIVAL, req.rid, int(wreq.session_id), int(wreq.turn), req.input_len,
                           int(wreq.output_len), req.max_new_tokens, -1, str(wreq.rid), new, prefix_rid,
                           prefix_blocks)
            if self._too_long(wreq):
                self._complete(req, "too_long")
            else:
                self.waiting.append(req)

    def _too_long(self, wreq) -> bool:
        """Whether an arriving request is aborted at once: its prompt and a page do not fit the
        empty full pool."""
        return wreq.input_len + self.settings.page_size >= self.settings.full_pool_tokens

    def _max_new_tokens(self, input_len: int, max_new_tokens: int) -> int:
        """sglang ``Scheduler.init_req_max_new_tokens``: ``max_new_tokens`` clipped to the request
        row (``max_req_len - input_len - 1``) and to what the empty full pool holds beside the
        prompt (the base allocator's ``max_new_tokens_for_memory``; the SWA allocator keeps it)."""
        s = self.settings
        n = max(0, min(max_new_tokens, self._max_req_len - input_len - 1))
        return max(0, min(n, s.full_pool_tokens - ceil_page(input_len, s.page_size) - s.page_size - 1))

    # ---------------------------------------------------------------- batch selection
    def _next_batch(self):
        self._last_retracted = 0
        if self.chunked_req is not None and self.chunked_req.extend_end > self.chunked_req.prefix_len:
            self._checkpoint(self.chunked_req)
        self._merge_last_prefill()
        before = len(self.running)
        self.running = [r for r in self.running if r.rid in self._active and r.in_model]
        if len(self.running) < before:
            self.batch_is_full = False
        batch = self._new_prefill_batch()
        if batch is not None:
            return batch, "prefill"
        if self.running:
            return self._update_running_batch(), "decode"
        return None, "idle"

    def _merge_last_prefill(self) -> None:
        """After a prefill step, its requests (but the chunked one, and those that finished or
        left the model) join the running batch (sglang ``merge_batch``), once: the merged batch is
        let go (``last_batch`` None until the next step sets it), so that a second call before
        the next step (a stretch's, then the step's own) changes nothing, ``batch_is_full``
        included."""
        last = self.last_batch
        if last is not None and self.last_mode == "prefill":
            keep = [r for r in last if r is not self.chunked_req and r.rid in self._active
                    and r.in_model and r not in self.running]
            if len(keep) < len(last):
                self.batch_is_full = False
            self.running.extend(keep)
            self.last_batch = None

    # ---------------------------------------------------------------- forward + results
    def _charge(self, num_tokens: int) -> int:
        step_ns = self.settings.step_fixed_ns + self.settings.step_per_token_ns * num_tokens
        self.clock_ns += step_ns
        return step_ns

    def _run_batch(self, batch: list[RefReq], mode: str, num_retracted: int) -> StepRecord:
        self._idle_streak = 0
        if mode == "prefill":
            num_tokens = sum(r.extend_end - r.prefix_len for r in batch)
            step_ns = self._charge(num_tokens)
            self._process_prefill(batch)
            self.result.num_prefill_steps += 1
            self.result.prefill_tokens += num_tokens
        else:
            num_tokens = len(batch)
            step_ns = self._charge(num_tokens)
            self._process_decode(batch)
            self.result.num_decode_steps += 1
            self.result.decode_tokens += num_tokens
        self.last_batch, self.last_mode = batch, mode
        self.result.num_steps += 1
        self.result.clock_ns = self.clock_ns
        return StepRecord(self.forward_ct, mode, len(batch), num_tokens, step_ns, self.clock_ns, num_retracted)

    def _next_token(self, req: RefReq) -> int:
        n = len(req.output_ids)
        return req.plan[n] if n < len(req.plan) else EOS_TOKEN_ID

    def _append_token(self, req: RefReq) -> None:
        req.output_ids.append(self._next_token(req))  # the request's keys read output_ids

    def _process_prefill(self, batch: list[RefReq]) -> None:
        for req in batch:
            if req.rid not in self._active:
                continue
            if req.inflight_chunks > 0:
                req.inflight_chunks -= 1
                continue
            self._append_token(req)
            if req.finished():
                self._release(req, checkpoint=True)
                self._complete(req, "finished")
            else:
                self._checkpoint(req)

    def _process_decode(self, batch: list[RefReq]) -> None:
        self.model.free_group_begin()
        try:
            for req in batch:
                n = len(req.output_ids)  # _append_token, inlined on the per-token path
                tok = req.plan[n] if n < len(req.plan) else EOS_TOKEN_ID
                out = req.output_ids
                out.append(tok)
                if tok == EOS_TOKEN_ID or len(out) >= req.max_new_tokens:  # ``req.finished()``
                    self._release(req, checkpoint=True)
                    self._complete(req, "finished")
        finally:
            self.model.free_group_end()

    def _checkpoint(self, req: RefReq) -> None:
        """Unfinished insert of the computed KV (sglang ``checkpoint_kv_cache``)."""
        st = self.model.request(req.rid)
        before = st.swa_released_tokens
        prot0 = st.protected_tokens
        self.model.checkpoint(req.rid, page_hashes=req.keys.covering(st.seq_tokens))
        self._emit_inserted(req, st, before, prot0)

    def _release(self, req: RefReq, checkpoint: bool) -> None:
        st = self.model.request(req.rid)
        prot0 = st.protected_tokens
        if checkpoint:
            self.model.release(req.rid, checkpoint=True, page_hashes=req.keys.covering(st.seq_tokens))
            tracer.cache(int(CacheOp.INSERT), req.rid, 0, 0, 0, max(0, st.protected_tokens - prot0))
        else:
            self.model.release(req.rid, checkpoint=False)
        tracer.cache(int(CacheOp.RELEASE), req.rid, 0, 0, 0, st.seq_tokens)
        req.in_model = False
        if self.chunked_req is req:
            self.chunked_req = None

    def _emit_inserted(self, req, st, released_before: int, prot0: int) -> None:
        if st.swa_released_tokens > released_before:  # the slots the insert's release freed
            tracer.cache(int(CacheOp.SWA_RELEASE), req.rid, 0, 0, 0, 0, st.swa_released_tokens - released_before)
        tracer.cache(int(CacheOp.INSERT), req.rid, 0, 0, 0, max(0, st.protected_tokens - prot0))

    def _complete(self, req: RefReq, reason: str) -> None:
        self._active.pop(req.rid, None)
        if reason == "finished":
            self.result.num_finished += 1
            self.result.cached_tokens += req.cached_tokens
        else:
            self.result.num_aborted += 1
        # a finished request ran in this step's batch, which the waiting queue never holds (the
        # admission cuts what it admits off the queue): no scan of a long queue per finish
        if reason != "finished" and req in self.waiting:
            self.waiting.remove(req)
        event = RequestEvent.FINISH if reason == "finished" else RequestEvent.ABORT
        tracer.request(int(event), req.rid, int(req.wreq.session_id), -1, req.input_len, len(req.output_ids),
                       req.max_new_tokens, req.cached_tokens, str(req.wreq.rid), None)
        if self.observer is not None:
            self.observer.on_finish(req.wreq, req, self.clock_ns, reason)

    def _idle_step(self, num_retracted: int) -> StepRecord:
        if not self.waiting and not self.running and self.chunked_req is None:
            self.ratio.reset()
        if self._next_arrival < len(self._pending):
            self.clock_ns = max(self.clock_ns, self._pending[self._next_arrival].arrival_ns)
        else:
            self._idle_streak += 1
            if (self.waiting and not self.running and self.chunked_req is None
                    and self._idle_streak >= _UNSCHEDULABLE_AFTER_IDLE_STEPS):
                self._idle_streak = 0
                self._complete(self.waiting.pop(0), "unschedulable")
            elif self._idle_streak > _STALLED_AFTER_IDLE_STEPS:
                raise RuntimeError(f"reference backend stalled at step {self.forward_ct}: {len(self.waiting)} "
                                   f"waiting, {len(self.running)} running; occupancy={self._occ_text()}")
        self.last_batch, self.last_mode = None, "idle"
        return StepRecord(self.forward_ct, "idle", 0, 0, 0, self.clock_ns, num_retracted)

    # ---------------------------------------------------------------- sampling
    def _sample(self, record: StepRecord) -> None:
        mode = _MODE_IDS[record.mode]
        # As the hooks' step clock on the real loop: steps count from 1, and of consecutive idle
        # steps only the first is written (``KVTRACE_IDLE_SAMPLE_MS``; an idle streak of a replay
        # takes far less than that). Numbered as the hooks number sglang's Scheduler (its
        # ``forward_ct``, batches run so far): an idle step repeats the number of the batch before
        # it (``kvtrace diff`` aligns steps by position, so the mirror's numbering compares too).
        idle = record.mode == "idle"
        if idle and self._sampled_idle:
            return
        self._sampled_idle = idle
        if not idle:
            self.trace_ct += 1
        fct = self.trace_ct
        tracer.sched(_STEP, fct, mode, record.batch_size, record.num_tokens, 0)
        stats = tracer.stats
        for name, capacity, available, evictable, protected, held in self.model.occupancy_rows():
            stats(fct, _POOL_IDS[name], capacity, available, evictable, protected, held)

    def _occ_text(self) -> str:
        return str({k: v.__dict__ for k, v in self.model.snapshot().items()})


__all__ = ["ReferenceBackend", "RefReq"]
