"""The CPU scheduler loop that drives the real sglang 0.5.23 scheduling and memory code.

One :meth:`SglangBackend.step` is one iteration of sglang's (non-overlap) scheduler, made of the
same calls ``Scheduler.get_next_batch_to_run`` / ``process_batch_result_*`` make, in the same
order, on the real objects (see ``build.py``):

1. HiCache events (``tree.check_hicache_events``), arrivals up to the virtual clock.
2. Stash the chunked request (``checkpoint_kv_cache``), merge the last prefill batch into the
   running batch (``ScheduleBatch.filter_batch`` / ``merge_batch``).
3. Prefill admission: ``SchedulePolicy.calc_priority``, ``PrefillAdder.add_chunked_req`` /
   ``add_one_req`` (budgets, chunking, SWA shrink), ``ScheduleBatch.init_new`` +
   ``prepare_for_extend`` (``alloc_for_extend``: ``maybe_evict_swa``, tree eviction, the real
   allocator), ``ready_to_load_host_cache``.
4. Otherwise decode: ``check_decode_mem`` → ``retract_decode`` when memory runs out, then
   ``prepare_for_decode`` (``alloc_for_decode``, out-of-window SWA release every
   ``SGLANG_SWA_EVICTION_INTERVAL`` tokens).
5. "Forward": no model runs; each request gets its next synthesized token, the virtual clock
   advances by ``step_fixed_ns + step_per_token_ns * tokens``.
6. Results: ``update_finish_state``, then ``release_kv_cache`` (finished) or
   ``checkpoint_kv_cache`` (prefill done, decoding continues), decode frees inside a free group.

No wall clock is read for any decision. Only the loop's own bookkeeping (arrivals, finishes,
step records) is reported to a :class:`LoopObserver`; everything the real code does is visible
to the tracer hooks (``tracer.sglang``) wrapped around the real classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Callable, Protocol

from replay.backends.sglang.build import Runtime, build_runtime, sglang_env
from replay.backends.sglang.occupancy import PoolOccupancy, check_identity, measure
from replay.backends.sglang.settings import SglangSettings
from replay.backends.sglang.tokens import EOS_TOKEN_ID, TokenSynth
from replay.backends.sglang.workload import Workload, WorkloadRequest
from replay.backends.sglang_env import bootstrap
from replay.backends.sglang_patches import apply_patches


#: Why a request left: ``finished`` (stop token or length), ``retract_oom`` (aborted by
#: ``retract_decode``: out of memory even alone), ``too_long`` (refused at arrival: the prompt
#: does not fit the full pool), ``unschedulable`` (nothing running, nothing arriving, and the
#: admission code still refuses it).
FINISH_REASONS = ("finished", "retract_oom", "too_long", "unschedulable")
_UNSCHEDULABLE_AFTER_IDLE_STEPS = 3


@dataclass(frozen=True)
class StepRecord:
    """One scheduler iteration.

    Attributes:
        forward_ct: step number (0-based).
        mode: 'prefill' | 'decode' | 'idle'.
        batch_size: requests in the batch.
        num_tokens: tokens run (extend tokens or one per decoding request).
        step_ns: virtual duration charged to the step.
        clock_ns: virtual clock after the step.
        num_retracted: requests retracted in this step.
        cpu_ns: host time the step's scheduling code took (measured, never used in decisions).
    """

    forward_ct: int
    mode: str
    batch_size: int
    num_tokens: int
    step_ns: int
    clock_ns: int
    num_retracted: int = 0
    cpu_ns: int = 0


class LoopObserver(Protocol):
    """What the loop reports about its own bookkeeping (all methods optional to implement)."""

    def on_arrival(self, wreq: WorkloadRequest, clock_ns: int) -> None: ...

    def on_finish(self, wreq: WorkloadRequest, req: Any, clock_ns: int, reason: str) -> None:
        """``reason``: one of :data:`FINISH_REASONS`."""

    def on_step(self, step: StepRecord, backend: SglangBackend) -> None: ...


@dataclass
class RunResult:
    """Summary of one run (JSON-friendly)."""

    settings: dict
    num_requests: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_retractions: int = 0
    num_steps: int = 0
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    clock_ns: int = 0
    final_occupancy: dict = field(default_factory=dict)


class _Active:
    """Per-request loop state: the workload row and its output token plan."""

    __slots__ = ("wreq", "out_tokens")

    def __init__(self, wreq: WorkloadRequest, out_tokens: list[int]) -> None:
        self.wreq = wreq
        self.out_tokens = out_tokens


class SglangBackend:
    """Runs a workload through the real sglang scheduler and memory classes on CPU.

    Use as a context manager: entering sets the run's ``SGLANG_*`` switches, builds the real
    objects and applies the listed patches; leaving undoes all three.

    Args:
        workload: the arrivals to serve.
        settings: sizes and policies.
        observer: receives arrivals, finishes and step records.
        check_integrity_every: run :meth:`check_integrity` every N steps (0 = never).
        debug_memory_pool: ``SGLANG_DEBUG_MEMORY_POOL`` (double-free detection in the allocators).
    """

    def __init__(self, workload: Workload, settings: SglangSettings | None = None, *,
                 observer: LoopObserver | None = None, check_integrity_every: int = 0,
                 debug_memory_pool: bool = True) -> None:
        self.workload = workload
        self.settings = settings or SglangSettings()
        self.observer = observer
        self.check_integrity_every = check_integrity_every
        self.debug_memory_pool = debug_memory_pool
        self.rt: Runtime | None = None
        self._stack: contextlib.ExitStack | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> SglangBackend:
        bootstrap()
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        stack = contextlib.ExitStack()
        try:
            stack.enter_context(sglang_env(self.settings, debug_memory_pool=self.debug_memory_pool))
            max_ctx = self.settings.max_context_tokens or (self.workload.max_seq_tokens + 1)
            self.rt = build_runtime(self.settings, max_context_tokens=max_ctx)
            stack.callback(self.rt.close)
            stack.enter_context(apply_patches(self.settings, self.rt))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._synth = TokenSynth(self.workload)
        self._pending = list(self.workload.requests)
        self._next_arrival = 0
        self.clock_ns = self._pending[0].arrival_ns if self._pending else 0
        self.forward_ct = 0
        self.waiting: list = []
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.chunked_req = None
        self._active: dict[str, _Active] = {}
        self._last_retracted = 0
        self._idle_streak = 0
        self.result = RunResult(settings=self.settings.to_dict(), num_requests=len(self._pending))
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    # ---------------------------------------------------------------- public API
    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self._pending) and not self._active

    def run(self, *, on_progress: Callable[[int], None] | None = None) -> RunResult:
        """Step until every request has finished or been aborted.

        Args:
            on_progress: called with the number of requests completed in each step.
        Returns:
            :class:`RunResult` (also ``self.result``).
        """
        while not self.done:
            before = self.result.num_finished + self.result.num_aborted
            self.step()
            if on_progress is not None:
                on_progress(self.result.num_finished + self.result.num_aborted - before)
        self.result.final_occupancy = {p: o.as_dict() for p, o in self.occupancy().items()}
        return self.result

    def step(self) -> StepRecord:
        """One scheduler iteration (see the module docstring). Returns its record."""
        t0 = perf_counter_ns()
        rt = self.rt
        if rt.tree.cache_controller is not None:
            rt.tree.check_hicache_events()
        self._admit_arrivals()
        batch = self._next_batch()
        num_retracted = self._last_retracted
        if batch is None:
            record = self._idle_step(num_retracted)
        else:
            record = self._run_batch(batch, num_retracted)
        self.forward_ct += 1
        # The scheduler's per-step pool sample; tracer hooks take it as the step boundary, so
        # it runs exactly once per step, after the step's results are processed.
        rt.stats_observer.get_pool_stats()
        record = dataclasses.replace(record, cpu_ns=perf_counter_ns() - t0)
        if self.observer is not None:
            self.observer.on_step(record, self)
        if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
            self.check_integrity()
        return record

    def occupancy(self) -> dict[str, PoolOccupancy]:
        """Per-pool capacity/available/evictable/protected/held from the real objects."""
        return measure(self.rt, self._owners())

    def check_integrity(self) -> None:
        """Assert the occupancy identity of every pool against the real pools and tree.

        Raises:
            AssertionError: a pool's available + evictable + protected + held != capacity, or
                a request row is unaccounted for.
        """
        check_identity(self.rt, self._owners())

    # ---------------------------------------------------------------- arrivals
    def _admit_arrivals(self) -> None:
        pending = self._pending
        while self._next_arrival < len(pending) and pending[self._next_arrival].arrival_ns <= self.clock_ns:
            wreq = pending[self._next_arrival]
            self._next_arrival += 1
            if self.observer is not None:
                self.observer.on_arrival(wreq, self.clock_ns)
            req = self._make_req(wreq)
            if wreq.input_len + self.settings.page_size >= self.settings.full_pool_tokens:
                self._abort(req, "too_long", "prompt does not fit the full KV pool")
            else:
                self.waiting.append(req)

    def _make_req(self, wreq: WorkloadRequest):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=wreq.max_new_tokens, temperature=0.0)
        sp.normalize(None)
        req = Req(str(wreq.rid), "", self._synth.prompt_ids(wreq), sp,
                  eos_token_ids={EOS_TOKEN_ID}, vocab_size=None)
        self._active[req.rid] = _Active(wreq, self._synth.output_ids(wreq))
        return req

    # ---------------------------------------------------------------- batch selection
    def _next_batch(self):
        """Mirror of ``Scheduler.get_next_batch_to_run`` (non-overlap, no PP/DP/spec)."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        self._last_retracted = 0
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.rt.tree)  # stash_chunked_request
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < last_bs:
                self.running.batch_is_full = False
            if not last.is_empty() and last is not self.running:
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        running_bs = self.running.batch_size()
        self.running.filter_batch()
        if self.running.batch_size() < running_bs:
            self.running.batch_is_full = False
        new_batch = self._new_prefill_batch()
        if new_batch is not None:
            return new_batch
        if not self.running.is_empty():
            return self._update_running_batch()
        return None

    def _num_allocatable_reqs(self, running_bs: int, num_held_rows: int = 0) -> int:
        rows = self.rt.req_to_token_pool.available_size() + num_held_rows
        return max(0, min(self.settings.max_running_requests - running_bs, rows))

    def _new_prefill_batch(self):
        """Mirror of ``Scheduler._get_new_batch_prefill_raw`` (no LoRA, grammar, storage, PP)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        rt, s, running = self.rt, self.settings, self.running
        if s.has_swa or running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = running.batch_size()
        if self._num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        rt.policy.calc_priority(self.waiting, running)
        adder = PrefillAdder(
            s.page_size, rt.tree, rt.allocator, running, rt.ratio.current, s.max_prefill_tokens,
            s.chunked_prefill_size, 0, 0, max_prefill_bs=0, max_running_requests=s.max_running_requests,
            waiting_queue_len=len(self.waiting),
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = rt.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting, adder.rem_chunk_tokens or 0, s.page_size)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            num_held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(running.batch_size(), num_held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(rt.tree)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                                    truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        admitted = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = ScheduleBatch.init_new(can_run, rt.req_to_token_pool, rt.allocator, rt.tree, rt.model_config,
                                       False, SpeculativeAlgorithm.NONE, chunked_req=self.chunked_req)
        if rt.tree.cache_controller is not None:
            batch.hicache_consumer_index = rt.tree.ready_to_load_host_cache()
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        return batch

    def _update_running_batch(self):
        """Mirror of ``Scheduler.update_running_batch``: retract when decode memory runs out."""
        batch = self.running
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        initial_bs = batch.batch_size()
        if not batch.check_decode_mem():
            retracted, new_ratio, aborted = batch.retract_decode()
            self.rt.ratio.current = new_ratio
            self._last_retracted = len(retracted)
            self.result.num_retractions += len(retracted)
            for req in aborted:
                self._complete(req, "retract_oom")
            self.waiting.extend(retracted)
        else:
            self.rt.ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return None
        batch.prepare_for_decode()
        return batch

    # ---------------------------------------------------------------- forward + results
    def _charge(self, num_tokens: int) -> int:
        step_ns = self.settings.step_fixed_ns + self.settings.step_per_token_ns * num_tokens
        self.clock_ns += step_ns
        return step_ns

    def _idle_step(self, num_retracted: int) -> StepRecord:
        if self._next_arrival < len(self._pending):
            nxt = self._pending[self._next_arrival].arrival_ns
            self.clock_ns = max(self.clock_ns, nxt)
        elif self.waiting and self.running.is_empty() and self.chunked_req is None:
            # Nothing runs, nothing will arrive, and the head cannot be admitted (after a few
            # steps, so pending HiCache acks can land): a request the pools can never hold. A
            # server would reject it; abort it so the run ends.
            self._idle_streak += 1
            if self._idle_streak >= _UNSCHEDULABLE_AFTER_IDLE_STEPS:
                self._idle_streak = 0
                self._abort(self.waiting.pop(0), "unschedulable", "admission refuses it with the pools idle")
        self.last_batch = None
        return StepRecord(self.forward_ct, "idle", 0, 0, 0, self.clock_ns, num_retracted)

    def _next_token(self, req) -> int:
        plan = self._active[req.rid].out_tokens
        n = len(req.output_ids)
        return plan[n] if n < len(plan) else EOS_TOKEN_ID

    def _run_batch(self, batch, num_retracted: int) -> StepRecord:
        self._idle_streak = 0
        if batch.forward_mode.is_extend():
            num_tokens = batch.extend_num_tokens
            step_ns = self._charge(num_tokens)
            self._process_prefill(batch)
            self.result.num_prefill_steps += 1
            self.result.prefill_tokens += num_tokens
            mode = "prefill"
        else:
            num_tokens = batch.batch_size()
            step_ns = self._charge(num_tokens)
            self._process_decode(batch)
            self.result.num_decode_steps += 1
            self.result.decode_tokens += num_tokens
            mode = "decode"
        self.last_batch = batch
        self.result.num_steps += 1
        self.result.clock_ns = self.clock_ns
        return StepRecord(self.forward_ct, mode, batch.batch_size(), num_tokens, step_ns, self.clock_ns,
                          num_retracted)

    def _process_prefill(self, batch) -> None:
        """Mirror of ``process_batch_result_prefill`` for the memory-relevant calls."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tree = self.rt.tree
        for req in batch.reqs:
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1  # a middle chunk: no output yet
                continue
            req.output_ids.append(self._next_token(req))
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, tree, checkpoint=True)
                self._complete(req, "finished")
            else:
                checkpoint_kv_cache(req, tree)

    def _process_decode(self, batch) -> None:
        """Mirror of ``process_batch_result_decode`` for the memory-relevant calls."""
        from sglang.srt.mem_cache.common import release_kv_cache

        allocator, tree = self.rt.allocator, self.rt.tree
        allocator.free_group_begin()
        try:
            for req in batch.reqs:
                req.output_ids.append(self._next_token(req))
                req.update_finish_state(1)
                if req.finished():
                    release_kv_cache(req, tree, checkpoint=True)
                    self._complete(req, "finished")
        finally:
            allocator.free_group_end()

    def _abort(self, req, reason: str, message: str) -> None:
        """Abort a request that holds no KV (as the scheduler's abort path marks it)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req.finished_reason = FINISH_ABORT(message)
        self._complete(req, reason)

    def _complete(self, req, reason: str) -> None:
        active = self._active.pop(req.rid)
        if reason == "finished":
            self.result.num_finished += 1
            self.result.cached_tokens += int(req.cached_tokens)
        else:
            self.result.num_aborted += 1
        if self.observer is not None:
            self.observer.on_finish(active.wreq, req, self.clock_ns, reason)

    # ---------------------------------------------------------------- accounting
    def _owners(self) -> list:
        """Requests that own a request row now (running, last batch, chunked)."""
        reqs = list(self.running.reqs)
        if self.last_batch is not None and self.last_batch is not self.running:
            reqs += self.last_batch.reqs
        if self.chunked_req is not None:
            reqs.append(self.chunked_req)
        seen, owners = set(), []
        for r in reqs:
            if id(r) not in seen and r.kv.holds_kv:
                seen.add(id(r))
                owners.append(r)
        return owners


def run_backend(workload: Workload, settings: SglangSettings | None = None, **kwargs) -> RunResult:
    """Build, run and tear down a backend in one call (``kwargs`` go to :class:`SglangBackend`)."""
    with SglangBackend(workload, settings, **kwargs) as backend:
        return backend.run()
