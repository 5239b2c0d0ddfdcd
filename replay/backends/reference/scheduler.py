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
from replay.backends.reference.budget import CLIP_MAX_NEW_TOKENS, NewTokenRatio, PrefillBudget, ceil_page
from replay.backends.reference.keys import PageKeys
from replay.backends.reference.settings import ReferenceSettings
from replay.memory import KVCacheModel
from tracer.schema import CacheOp, Mode, Pool, RequestEvent, SchedKind, Verdict

EOS_TOKEN_ID = 0
_UNSCHEDULABLE_AFTER_IDLE_STEPS = 3
_STALLED_AFTER_IDLE_STEPS = 1000
_WAITING_PREFIX_REFRESH_INTERVAL = 32  # sglang schedule_policy constants
_WAITING_QUEUE_PREFIX_MATCH_MAX = 128
_POOLS = (("full", Pool.FULL), ("swa", Pool.SWA), ("host_full", Pool.HOST_FULL), ("host_swa", Pool.HOST_SWA))


class RefReq:
    """One request: its workload row, tokens, and scheduling state (sglang ``Req``'s fields)."""

    __slots__ = ("wreq", "rid", "input_len", "max_new_tokens", "plan", "output_ids", "keys", "prefix_len",
                 "extend_end", "in_model", "cached_tokens", "host_hit", "swa_host_hit", "inflight_chunks",
                 "retracted", "first_prefix", "decode_batch_idx")

    def __init__(self, wreq, prompt, plan: list[int], ps: int, max_new_tokens: int) -> None:
        self.wreq = wreq
        self.rid = int(wreq.rid)
        self.input_len = int(wreq.input_len)
        self.max_new_tokens = max_new_tokens
        self.plan = plan
        self.output_ids: list[int] = []
        self.keys = PageKeys(prompt, ps)
        self.prefix_len = 0
        self.extend_end = 0
        self.in_model = False
        self.cached_tokens = 0
        self.host_hit = self.swa_host_hit = 0
        self.inflight_chunks = 0
        self.retracted = False
        self.first_prefix = -1
        self.decode_batch_idx = 0  # decode steps since (re)admission (sglang ``Req.decode_batch_idx``)

    @property
    def fill_len(self) -> int:
        """Tokens to prefill: the prompt plus what it generated before a retraction."""
        return self.input_len + len(self.output_ids)

    def finished(self) -> bool:
        return bool(self.output_ids) and (self.output_ids[-1] == EOS_TOKEN_ID
                                          or len(self.output_ids) >= self.max_new_tokens)


class ReferenceBackend:
    """Runs a workload through the reference scheduler and memory model.

    Args:
        workload: the arrivals (:class:`replay.workloads.Workload`).
        settings: sizes and policies.
        observer: a :class:`replay.backends.base.LoopObserver`.
        check_integrity_every: run :meth:`check_integrity` every N steps (0 = never).
    """

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
        # ``pool`` rows: every allocator and host pool of the model emits its alloc/free through
        # the tracer (a no-op when not recording), as the real allocators' hooks do.
        pools = self.model.pools
        for alloc in (pools.full, pools.swa, self.model.host_full, self.model.host_swa):
            if alloc is not None:
                alloc.emit = tracer.pool
        self._synth = TokenSynth(self.workload)
        self._pending = list(self.workload.requests)
        self._next_arrival = 0
        self.clock_ns = self._pending[0].arrival_ns if self._pending else 0
        self.forward_ct = 0
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
        return None

    # ---------------------------------------------------------------- public API
    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self._pending) and not self._active

    def run(self) -> RunResult:
        """Step until every request has finished or been aborted."""
        while not self.done:
            self.step()
        self.result.final_occupancy = {k: v.__dict__ for k, v in self.model.snapshot().items()}
        return self.result

    def step(self) -> StepRecord:
        """One scheduler iteration; returns its record."""
        t0 = perf_counter_ns()
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        self._admit_arrivals()
        batch, mode = self._next_batch()
        if batch is None:
            record = self._idle_step(self._last_retracted)
        else:
            record = self._run_batch(batch, mode, self._last_retracted)
        self._sample(record)
        self.forward_ct += 1
        record = StepRecord(record.forward_ct, record.mode, record.batch_size, record.num_tokens, record.step_ns,
                            record.clock_ns, record.num_retracted, perf_counter_ns() - t0)
        if self.observer is not None:
            self.observer.on_step(record, self)
        if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
            self.check_integrity()
        return record

    def occupancy(self) -> dict:
        """Per-pool capacity/available/evictable/protected/held (tokens)."""
        return self.model.snapshot()

    def check_integrity(self) -> None:
        """Check the model's pools, tree and rows (raises ``IntegrityError``, an AssertionError)."""
        self.model.check_integrity()

    # ---------------------------------------------------------------- arrivals
    def _admit_arrivals(self) -> None:
        pending, s = self._pending, self.settings
        while self._next_arrival < len(pending) and pending[self._next_arrival].arrival_ns <= self.clock_ns:
            wreq = pending[self._next_arrival]
            self._next_arrival += 1
            if self.observer is not None:
                self.observer.on_arrival(wreq, self.clock_ns)
            prompt = self._synth._sequence(wreq, wreq.input_len)
            req = RefReq(wreq, prompt, self._synth.output_ids(wreq), s.page_size,
                         self._max_new_tokens(int(wreq.input_len), int(wreq.max_new_tokens)))
            self._active[req.rid] = req
            tracer.request(int(RequestEvent.ARRIVAL), req.rid, int(wreq.session_id), int(wreq.turn),
                           req.input_len, int(wreq.output_len), req.max_new_tokens, -1, str(wreq.rid),
                           [int(h) for h in wreq.page_hashes])
            if wreq.input_len + s.page_size >= s.full_pool_tokens:
                self._complete(req, "too_long")
            else:
                self.waiting.append(req)

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
        last = self.last_batch
        if last is not None and self.last_mode == "prefill":
            keep = [r for r in last if r is not self.chunked_req and r.rid in self._active
                    and r.in_model and r not in self.running]
            if len(keep) < len(last):
                self.batch_is_full = False
            self.running.extend(keep)
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

    def _allocatable(self, running_bs: int) -> int:
        return max(0, self.max_rows - running_bs)

    def _new_prefill_batch(self):
        s = self.settings
        if s.has_swa or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        if self._allocatable(len(self.running)) <= 0 and self.chunked_req is None:
            self.batch_is_full = True
            return None
        self._touch_waiting_prefixes()
        budget = PrefillBudget(self.model, s, self.running, self.ratio.current)
        can_run: list[RefReq] = []
        extends: dict[int, int] = {}
        new_chunked = None
        if self.chunked_req is not None:
            req = self.chunked_req
            req.prefix_len = req.extend_end
            avail = budget.available_chunk_tokens()
            if avail is not None:
                remaining = req.fill_len - req.prefix_len
                n = min(remaining, avail)
                truncated = remaining > avail
                req.extend_end = req.prefix_len + n
                can_run.append(req)
                extends[req.rid] = n
                budget.reserve(n, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), budget.rem_chunk)
                self._emit_admit(req, req.prefix_len, remaining, 0, n,
                                 Verdict.CHUNKED if truncated else Verdict.ADMITTED, budget, -1)
                if not truncated:
                    self.chunked_req = None
            else:
                self._emit_admit(req, req.prefix_len, req.fill_len - req.prefix_len, 0, 0, Verdict.NO_TOKEN, budget,
                                 -1, ("", True))
        for req in list(self.waiting):
            # only ``other`` stops before the candidate: with ``no_token`` sglang still runs
            # ``add_one_req``, whose budget check refuses it (and the tracer records the row)
            if budget.state() == "other":
                break
            if len(can_run) >= self._allocatable(len(self.running)):
                self.batch_is_full = True
                break
            res = self._add_one_req(req, budget, can_run, extends)
            if res == "chunked":
                new_chunked = req
                res = budget.state()
            if res != "continue":
                if res == "no_token":
                    self.batch_is_full = bool(can_run) or bool(self.running)
                break
        if not can_run:
            return None
        admitted = {r.rid for r in can_run}
        self.waiting = [r for r in self.waiting if r.rid not in admitted]
        if new_chunked is not None:
            self.chunked_req = new_chunked
        if self.chunked_req is not None:
            self.chunked_req.inflight_chunks += 1
        self._alloc_extend(can_run, extends)
        return can_run

    def _touch_waiting_prefixes(self) -> None:
        """``SchedulePolicy.calc_priority`` under fcfs (``_touch_waiting_prefixes``): every
        ``WAITING_PREFIX_REFRESH_INTERVAL``-th call with requests waiting, a tree walk of the first
        ``WAITING_QUEUE_PREFIX_MATCH_MAX`` waiting requests' whole token sequences, head last (it
        splits nodes and refreshes recency as a match does; the requests keep their state)."""
        if not self.waiting or self.settings.eviction_policy != "lru":
            return
        refresh = self._prefix_refresh_calls % _WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._prefix_refresh_calls += 1
        if refresh:
            for req in reversed(self.waiting[:_WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.model.match(req.keys.up_to(req.fill_len))

    def _add_one_req(self, req: RefReq, budget: PrefillBudget, can_run: list, extends: dict) -> str:
        """sglang ``init_next_round_input`` + ``add_one_req``: match, budget checks, lock."""
        s, ps, model = self.settings, self.settings.page_size, self.model
        keys = req.keys.up_to(req.fill_len)
        m = model.match(keys, max_tokens=req.fill_len - 1)
        model.admit(req.rid, keys, m, max_match_tokens=req.fill_len - 1, prompt_tokens=req.input_len)
        req.in_model = True
        req.prefix_len = m.device_hit_tokens
        req.host_hit, req.swa_host_hit = m.host_hit_tokens, m.swa_host_hit_tokens
        tracer.cache(int(CacheOp.MATCH), req.rid, m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens)
        max_new = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        prefix = req.prefix_len + req.host_hit
        extend = req.fill_len - prefix
        total = req.fill_len - req.prefix_len + max_new + ps
        ok, chunk_limit, need = budget.check_prefill(extend, total, max_new, req.swa_host_hit, budget.rem_chunk)
        if not ok:
            self._unadmit(req)
            # swa_wait: the total budget fit and the SWA budget did not (the tracer hook's rule)
            verdict = Verdict.SWA_WAIT if (s.has_swa and total < budget.rem_total) else Verdict.NO_TOKEN
            self._emit_admit(req, req.prefix_len, extend, req.host_hit, 0, verdict, budget, need, ("NO_TOKEN", False))
            return "no_token"
        is_chunked = False
        if chunk_limit is not None and ceil_page(extend, ps) > chunk_limit:
            cut = chunk_limit // ps * ps
            extend = (prefix + cut) // ps * ps - prefix
            if extend <= 0:
                self._unadmit(req)
                self._emit_admit(req, req.prefix_len, req.fill_len - prefix, req.host_hit, 0, Verdict.OTHER, budget,
                                 need, ("OTHER", True))
                return "other"
            is_chunked, max_new = True, 0
        device_prefix, requested = req.prefix_len, req.fill_len - prefix
        if req.host_hit or req.swa_host_hit:
            loaded = model.load_back(req.rid)
            if loaded:
                tracer.cache(int(CacheOp.LOAD_BACK), req.rid, 0, 0, 0, loaded, 0, loaded)
            req.prefix_len += req.host_hit
        shrunk = is_chunked and chunk_limit is not None and chunk_limit < budget.rem_chunk
        req.extend_end = req.prefix_len + extend
        if req.first_prefix < 0:
            req.first_prefix = req.prefix_len
        if not req.retracted:
            req.cached_tokens = req.prefix_len
        can_run.append(req)
        extends[req.rid] = extend
        # ``_select_prefill_admission`` reserves the whole clipped ``max_new_tokens`` (not what is
        # left of it after a retraction), 0 for a chunk
        budget.reserve(extend, 0 if is_chunked else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), budget.rem_chunk)
        verdict = Verdict.SHRUNK if shrunk else (Verdict.CHUNKED if is_chunked else Verdict.ADMITTED)
        self._emit_admit(req, device_prefix, requested, req.host_hit, extend, verdict, budget, need)
        return "chunked" if is_chunked else budget.state()

    def _unadmit(self, req: RefReq) -> None:
        self.model.release(req.rid, checkpoint=False)
        req.in_model = False

    def _emit_admit(self, req, prefix, requested, host_hit, got, verdict, budget, need, outcome=None) -> None:
        # As the tracer's admission hook on the real code: ``prefix`` is the device prefix before
        # any load-back; a request that keeps waiting for the same outcome (``outcome``: the
        # ``AddReqResult`` name and the budget check's answer; same prefix and request) gets one
        # row, not one per step, whatever the verdict (``no_token`` / ``swa_wait``) of the repeat.
        if got:
            self._last_reject.pop(req.rid, None)
        else:
            key = (outcome, prefix, requested)
            if self._last_reject.get(req.rid) == key:
                return
            self._last_reject[req.rid] = key
        tracer.sched(int(SchedKind.ADMIT), self.forward_ct, 0, 0, 0, 0, req.rid, prefix, requested, host_hit,
                     requested, got, int(verdict), int(budget.rem_total),
                     int(budget.rem_swa) if self.settings.has_swa else -1, need)

    def _evict(self, full_tokens: int, swa_tokens: int) -> None:
        res = self.model.make_room(full_tokens, swa_tokens)
        if res.full_tokens or res.swa_tokens or res.host_full_tokens:
            tracer.cache(int(CacheOp.EVICT), -1, 0, 0, 0, res.full_tokens, res.swa_tokens, res.host_full_tokens,
                         res.num_deleted_nodes + res.num_demoted_nodes + res.num_tombstoned_nodes,
                         res.num_tombstoned_nodes)

    def _alloc_extend(self, reqs: list[RefReq], extends: dict[int, int]) -> None:
        ps, model = self.settings.page_size, self.model
        items, extend_tokens = [], 0
        for r in reqs:
            st = model.request(r.rid)
            n = r.extend_end - st.seq_tokens
            if n > 0:
                items.append((r.rid, n))
                extend_tokens += n
        # The eviction demand of 0.5.23's ``alloc_for_extend``: the batch's extend tokens, plus one
        # page per request when paged (``alloc_paged_token_slots_extend``'s conservative estimate).
        need = extend_tokens + (len(reqs) * ps if ps > 1 else 0)
        self._evict(need, need if self.settings.has_swa else 0)
        if items and not model.alloc_extend_batch(items):
            raise RuntimeError(f"reference backend: step {self.forward_ct}: extend of {need} tokens does not fit "
                               f"after eviction; occupancy={self._occ_text()}")

    def _update_running_batch(self):
        batch = self.running
        if not batch:
            self.batch_is_full = False
            return None
        initial = len(batch)
        if not self._check_decode_mem(batch):
            retracted, aborted = self._retract(batch)
            self.ratio.current = NewTokenRatio.after_retract(self.running)
            self._last_retracted = len(retracted)
            self.result.num_retractions += len(retracted)
            for r in aborted:
                self._release(r, checkpoint=False)
                self._complete(r, "retract_oom")
            self.waiting.extend(retracted)
        else:
            self.ratio.decay_step()
        batch = self.running
        if len(batch) < initial:
            self.batch_is_full = False
        if not batch:
            return None
        self._prepare_decode(batch)
        return list(batch)

    def _decode_need(self, reqs) -> int:
        ps = self.settings.page_size
        states = self.model.requests.reqs  # read-only lookups, without the checked getter's call
        return sum(1 for r in reqs if states[r.rid].seq_tokens % ps == 0) * ps

    def _check_decode_mem(self, reqs) -> bool:
        need = self._decode_need(reqs)
        self._evict(need, need if self.settings.has_swa else 0)
        return self.model.pools.available_tokens() >= need

    def _retract(self, batch: list[RefReq]):
        order = sorted(range(len(batch)), key=lambda i: (len(batch[i].output_ids), -batch[i].input_len),
                       reverse=True)
        keep = list(order)
        retracted, aborted = [], []
        first = True
        while first or not self._check_decode_mem([batch[i] for i in keep]):
            if len(keep) == 1:
                break
            first = False
            req = batch[keep.pop()]
            self._emit_retract(req)
            self._release(req, checkpoint=False)
            # ``release_req``: use the freed memory at once, evicting for the requests still kept
            # (``remaining * SGLANG_RETRACT_DECODE_STEPS`` tokens, both pools).
            need = len(keep) * NewTokenRatio.RETRACT_DECODE_STEPS
            self._evict(need, need if self.settings.has_swa else 0)
            req.retracted = True
            req.prefix_len = req.extend_end = req.decode_batch_idx = 0
            retracted.append(req)
        if len(keep) <= 1 and not self._check_decode_mem([batch[i] for i in keep]):
            # the last request is aborted through the same ``release_req`` (a retract row)
            req = batch[keep.pop()]
            self._emit_retract(req)
            aborted.append(req)
        kept = set(keep)
        self.running = [r for i, r in enumerate(batch) if i in kept]
        return retracted, aborted

    def _emit_retract(self, req: RefReq) -> None:
        tracer.sched(int(SchedKind.RETRACT), self.forward_ct, 0, 0, 0, 0, req.rid, req.prefix_len,
                     max(0, self.model.request(req.rid).seq_tokens - req.prefix_len))

    def _prepare_decode(self, batch: list[RefReq]) -> None:
        s, model = self.settings, self.model
        if s.has_swa and s.swa_out_of_window_release != "off":
            get = model.requests.reqs.__getitem__
            window, interval = s.sliding_window_tokens, s.swa_eviction_interval_tokens
            for r in batch:
                if r.decode_batch_idx < 1:
                    continue  # ``maybe_evict_swa`` skips a request's first decode after its prefill
                st = get(r.rid)
                if st.seq_tokens - window < st.swa_evicted_tokens + interval:
                    continue  # release_out_of_window's own early exit, without the call chain
                freed = model.free_swa_out_of_window(r.rid, st.seq_tokens, interval)
                if freed:
                    tracer.cache(int(CacheOp.SWA_RELEASE), r.rid, 0, 0, 0, 0, freed)
        # ``alloc_for_decode``'s eviction demand: one page per request (``bs * page_size``), not
        # only the requests at a page boundary that the decode-memory check counted.
        need = len(batch) * s.page_size
        self._evict(need, need if s.has_swa else 0)
        if not model.alloc_decode([r.rid for r in batch]):
            raise RuntimeError(f"reference backend: step {self.forward_ct}: decode allocation failed after "
                               f"the decode-memory check; occupancy={self._occ_text()}")
        for r in batch:
            r.decode_batch_idx += 1

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
        tok = self._next_token(req)
        req.output_ids.append(tok)
        req.keys.append(tok)

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
                req.output_ids.append(tok)
                req.keys.append(tok)
                if req.finished():
                    self._release(req, checkpoint=True)
                    self._complete(req, "finished")
        finally:
            self.model.free_group_end()

    def _checkpoint(self, req: RefReq) -> None:
        """Unfinished insert of the computed KV (sglang ``checkpoint_kv_cache``)."""
        st = self.model.request(req.rid)
        before = st.swa_evicted_tokens
        prot0 = st.protected_tokens
        self.model.checkpoint(req.rid, page_hashes=req.keys.up_to(st.seq_tokens))
        self._emit_inserted(req, st, before, prot0)

    def _release(self, req: RefReq, checkpoint: bool) -> None:
        st = self.model.request(req.rid)
        before, prot0 = st.swa_evicted_tokens, st.protected_tokens
        if checkpoint:
            self.model.release(req.rid, checkpoint=True, page_hashes=req.keys.up_to(st.seq_tokens))
            tracer.cache(int(CacheOp.INSERT), req.rid, 0, 0, 0, max(0, st.protected_tokens - prot0))
        else:
            self.model.release(req.rid, checkpoint=False)
        tracer.cache(int(CacheOp.RELEASE), req.rid, 0, 0, 0, st.seq_tokens)
        req.in_model = False
        if self.chunked_req is req:
            self.chunked_req = None

    def _emit_inserted(self, req, st, swa_before: int, prot0: int) -> None:
        if st.swa_evicted_tokens > swa_before:
            tracer.cache(int(CacheOp.SWA_RELEASE), req.rid, 0, 0, 0, 0, st.swa_evicted_tokens - swa_before)
        tracer.cache(int(CacheOp.INSERT), req.rid, 0, 0, 0, max(0, st.protected_tokens - prot0))

    def _complete(self, req: RefReq, reason: str) -> None:
        self._active.pop(req.rid, None)
        if reason == "finished":
            self.result.num_finished += 1
            self.result.cached_tokens += req.cached_tokens
        else:
            self.result.num_aborted += 1
        if req in self.waiting:
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
        mode = {"idle": Mode.IDLE, "prefill": Mode.PREFILL, "decode": Mode.DECODE}[record.mode]
        fct = self.forward_ct + 1  # trace rows count steps from 1, as the hooks' step clock does
        tracer.sched(int(SchedKind.STEP), fct, int(mode), record.batch_size, record.num_tokens, 0)
        snap = self.model.snapshot()
        for name, pool in _POOLS:
            p = snap.get(name)
            if p is not None:
                tracer.stats(fct, int(pool), p.capacity, p.available, p.evictable, p.protected, p.held)

    def _occ_text(self) -> str:
        return str({k: v.__dict__ for k, v in self.model.snapshot().items()})


__all__ = ["ReferenceBackend", "RefReq"]
