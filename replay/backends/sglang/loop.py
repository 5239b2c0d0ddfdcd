"""The CPU scheduler loop that drives the real sglang 0.5.23 scheduling and memory code.

One :meth:`SglangBackend.step` is one iteration of sglang's (non-overlap) scheduler, made of the
same calls ``Scheduler.get_next_batch_to_run`` / ``process_batch_result_*`` make, in the same
order, on the real objects (see ``build.py``):

1. Arrivals up to the virtual clock; ``SchedulerPoolStatsObserver.get_pool_stats()`` (the
   scheduler's pool sample, which the tracer hooks take as the end of the previous step: the
   point where they sample sglang's own Scheduler); HiCache events (``check_hicache_events``).
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

Steps 2-4 and 6 live in ``mirror.py`` (the restated scheduler control flow); this module holds
the run's lifecycle, arrivals, the virtual clock and the accounting.

No wall clock is read for any decision. Only the loop's own bookkeeping (arrivals, finishes,
step records) is reported to a :class:`LoopObserver`; everything the real code does is visible
to the tracer hooks (``tracer.sglang``) wrapped around the real classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from time import perf_counter_ns
from typing import Callable

from replay.backends.base import LoopObserver, RunResult, StepRecord
from replay.backends.sglang.build import Runtime, build_runtime, sglang_env
from replay.backends.sglang.mirror import SchedulerMirror
from replay.backends.sglang.occupancy import PoolOccupancy, check_identity, measure
from replay.backends.sglang.settings import SglangSettings
from replay.backends.sglang.tokens import EOS_TOKEN_ID, TokenSynth
from replay.backends.sglang.workload import Workload, WorkloadRequest
from replay.backends.sglang.env import bootstrap
from replay.backends.sglang.patches import apply_patches


_UNSCHEDULABLE_AFTER_IDLE_STEPS = 3
_STALLED_AFTER_IDLE_STEPS = 1000  # idle steps with work left and no arrivals: a loop bug, fail loudly


class _Active:
    """Per-request loop state: the workload row and its output token plan."""

    __slots__ = ("wreq", "out_tokens")

    def __init__(self, wreq: WorkloadRequest, out_tokens: list[int]) -> None:
        self.wreq = wreq
        self.out_tokens = out_tokens


#: ``scheduler`` setting -> the SglangBackend subclass that runs it (``real``: registered by
#: replay.backends.sglang.scheduler, which the package imports; ``mirror``: SglangBackend itself)
SCHEDULER_BACKENDS: dict[str, type] = {}


class SglangBackend(SchedulerMirror):
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
    def __new__(cls, workload=None, settings=None, **kwargs):
        # The settings pick the scheduler: ``scheduler=real`` (default) is sglang's own
        # Scheduler (replay.backends.sglang.scheduler, registered in SCHEDULER_BACKENDS when the
        # package is imported), ``mirror`` this module's restatement.
        if cls is SglangBackend:
            name = getattr(settings or SglangSettings(), "scheduler", "mirror")
            if name != "mirror":
                if name not in SCHEDULER_BACKENDS:
                    raise ValueError(f"scheduler={name!r}: no such backend registered "
                                     f"(expected mirror or {', '.join(sorted(SCHEDULER_BACKENDS))})")
                cls = SCHEDULER_BACKENDS[name]
        return super().__new__(cls)

    def __enter__(self) -> SglangBackend:
        bootstrap()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(sglang_env(self.settings, debug_memory_pool=self.debug_memory_pool))
            max_ctx = self.settings.max_context_tokens or (self.workload.max_seq_tokens + 1)
            self._build(stack, max_ctx)
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
        self._active: dict[str, _Active] = {}
        self._last_retracted = 0
        self._idle_streak = 0
        self.result = RunResult(settings=self.settings.to_dict(), num_requests=len(self._pending))
        return self

    def _build(self, stack: contextlib.ExitStack, max_context_tokens: int) -> None:
        """Build the real objects (``self.rt``) and the scheduler state (mirror: restated)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.rt = build_runtime(self.settings, max_context_tokens=max_context_tokens)
        stack.callback(self.rt.close)
        self.waiting: list = []
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.chunked_req = None

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

        The steps run with autograd off, as sglang's ``Scheduler.event_loop_normal`` runs them
        (its ``DynamicGradMode``: ``torch.no_grad`` unless ``SGLANG_ENABLE_TORCH_INFERENCE_MODE``):
        no tensor of the scheduling or memory code needs gradients, and every small torch op of
        a step then skips autograd's dispatch (tensor values are the same).
        """
        import torch

        with torch.no_grad():
            while not self.done:
                before = self.result.num_finished + self.result.num_aborted
                self.step()
                if on_progress is not None:
                    on_progress(self.result.num_finished + self.result.num_aborted - before)
            self.close_step()
        self.result.final_occupancy = {p: o.as_dict() for p, o in self.occupancy().items()}
        return self.result

    def step(self) -> StepRecord:
        """One scheduler iteration (see the module docstring). Returns its record."""
        t0 = perf_counter_ns()
        rt = self.rt
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        self._admit_arrivals()
        # The scheduler's per-step pool sample, at the point where sglang's own Scheduler is
        # sampled by the tracer hooks (the top of get_next_batch_to_run: after the arrivals,
        # before HiCache events and batch selection). The hooks take it as the boundary of the
        # previous step; ``run`` closes the last step with one more call.
        rt.stats_observer.get_pool_stats()
        if rt.tree.cache_controller is not None:
            rt.tree.check_hicache_events()
        batch = self._next_batch()
        num_retracted = self._last_retracted
        if batch is None:
            record = self._idle_step(num_retracted)
        else:
            record = self._run_batch(batch, num_retracted)
        self.forward_ct += 1
        record = dataclasses.replace(record, cpu_ns=perf_counter_ns() - t0)
        if self.observer is not None:
            self.observer.on_step(record, self)
        if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
            self.check_integrity()
        return record

    def close_step(self) -> None:
        """End the last step for the tracer hooks: the pool sample that would open the next
        iteration (``run`` calls it once the workload is done; a caller stepping by hand may),
        then that iteration's HiCache events (the last write acks), as the real Scheduler's
        ``get_next_batch_to_run`` does (at the clock the last step ended at, as every other boundary)."""
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        self.rt.stats_observer.get_pool_stats()
        if self.rt.tree.cache_controller is not None:
            self.rt.tree.check_hicache_events()

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
            if self._refused_at_arrival(wreq):
                self._abort(req, "too_long", "prompt does not fit the full KV pool")
            else:
                self.waiting.append(req)

    def _refused_at_arrival(self, wreq: WorkloadRequest) -> bool:
        """A prompt the empty pools cannot hold (aborted ``too_long`` by both schedulers)."""
        s = self.settings
        return (wreq.input_len + s.page_size >= s.full_pool_tokens
                or self._max_new_tokens(wreq.input_len, wreq.max_new_tokens) is None)

    def _max_new_tokens(self, input_len: int, max_new_tokens: int) -> int | None:
        """``Scheduler.init_req_max_new_tokens``: ``max_new_tokens`` clipped to the request row
        (``max_req_len - input_len - 1``) and to what the empty pools can hold with the prompt
        (the allocator's own ``max_new_tokens_for_memory``); None when the prompt alone cannot fit.

        The Scheduler applies this to every arriving request; the admission budget
        (``PrefillAdder.add_one_req``) reserves the clipped value, so a long prompt whose
        ``prompt + max_new_tokens`` exceeds the pool is still admitted.
        """
        s = self.settings
        max_req_len = self.rt.max_context_tokens - 1  # the row width; the Scheduler's max_req_len
        n = max(0, min(max_new_tokens, max_req_len - input_len - 1))
        return self.rt.allocator.max_new_tokens_for_memory(
            input_len, n, token_capacity=s.full_pool_tokens,
            sliding_window_size=s.sliding_window_tokens if s.has_swa else None,
            chunk_size=s.chunked_prefill_size)

    def _make_req(self, wreq: WorkloadRequest):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=wreq.max_new_tokens, temperature=0.0)
        sp.normalize(None)
        # session_id is metadata unless --enable-session-radix-cache (off here); it lets the
        # hooks' arrival rows keep the workload's sessions.
        session = str(wreq.session_id) if wreq.session_id >= 0 else None
        req = Req(str(wreq.rid), "", self._synth.prompt_ids(wreq), sp,
                  eos_token_ids={EOS_TOKEN_ID}, vocab_size=None, session_id=session)
        # Clipped after the Req exists, as Scheduler.init_req_max_new_tokens clips it (0 for a
        # prompt that cannot fit, which is then aborted at arrival): the hooks' arrival row
        # (Req.__init__) keeps the requested value, as with sglang's own Scheduler.
        req.sampling_params.max_new_tokens = self._max_new_tokens(wreq.input_len, wreq.max_new_tokens) or 0
        self._active[req.rid] = _Active(wreq, self._synth.output_ids(wreq))
        return req

    # ---------------------------------------------------------------- forward + results
    def _charge(self, num_tokens: int) -> int:
        step_ns = self.settings.step_fixed_ns + self.settings.step_per_token_ns * num_tokens
        self.clock_ns += step_ns
        return step_ns

    def _idle_step(self, num_retracted: int) -> StepRecord:
        if not self.waiting and self.running.is_empty() and self.chunked_req is None:
            self.rt.ratio.reset()  # Scheduler.on_idle, fully idle
        if self._next_arrival < len(self._pending):
            nxt = self._pending[self._next_arrival].arrival_ns
            self.clock_ns = max(self.clock_ns, nxt)
        else:
            self._idle_streak += 1
            if (self.waiting and self.running.is_empty() and self.chunked_req is None
                    and self._idle_streak >= _UNSCHEDULABLE_AFTER_IDLE_STEPS):
                # Nothing runs, nothing will arrive, and the head cannot be admitted (after a
                # few steps, so pending HiCache acks can land): a request the pools can never
                # hold. A server would reject it; abort it so the run ends.
                self._idle_streak = 0
                self._abort(self.waiting.pop(0), "unschedulable", "admission refuses it with the pools idle")
            elif self._idle_streak > _STALLED_AFTER_IDLE_STEPS:
                raise RuntimeError(
                    f"backend stalled at step {self.forward_ct}: {len(self.waiting)} waiting, "
                    f"{self.running.batch_size()} running, chunked={self.chunked_req is not None}, "
                    f"occupancy={ {k: v.as_dict() for k, v in self.occupancy().items()} }")
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
