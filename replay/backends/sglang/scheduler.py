"""Replay through sglang 0.5.23's own ``Scheduler`` (the default of the real-code backend).

:class:`RealSchedulerBackend` builds a real ``sglang.srt.managers.scheduler.Scheduler`` in this
process and drives it as ``Scheduler.event_loop_normal`` does, one iteration per
:meth:`step`: ``process_input_requests`` (arrivals up to the virtual clock, as
``TokenizedGenerateReqInput``), ``get_next_batch_to_run`` → ``run_batch`` →
``process_batch_result``, ``on_idle`` when there is no batch. All scheduling decisions
(admission, chunking, retraction, new-token ratio, releases, HiCache acks) are sglang's own code.

What is not the real code (the stand-ins, all in this module):

- **The model worker** (:class:`_StandInWorker`): no weights, no forward pass. ``Scheduler``'s
  ``init_model_worker`` is replaced by one that hands the scheduler the pools built by
  :func:`replay.backends.sglang.build.build_pools` (sized by the settings, 1-head x 1-dim KV
  tensors) and a worker whose ``forward_batch_generation`` returns, per request, the next token
  of its synthesized output (:class:`replay.backends.sglang.tokens.TokenSynth`). The tree, the
  ``SchedulePolicy``, the pool stats observer etc. are built by the Scheduler's own ``__init__``
  (``kv_cache_builder.build_kv_cache`` picks ``UnifiedRadixCache`` with FULL+SWA components for
  the SWA-hybrid model config written by :func:`write_model_config`).
- **Outputs**: ``send_to_detokenizer`` is a sink; finishes are read from the requests after
  ``process_batch_result``. ``send_to_tokenizer`` keeps only the ``AbortReq`` the Scheduler sends
  for a request it ends outside the output stream (``send_abort_output``): that is how a server
  learns that ``retract_decode`` aborted a request out of memory even alone
  (``update_running_batch``), and how the backend learns it (:meth:`RealSchedulerBackend._to_tokenizer`).
- **The clock**: the virtual clock advances by ``step_fixed_ns + step_per_token_ns * tokens``
  per batch; no wall clock enters a decision (the scheduler's own wall-clock reads feed only its
  metrics and watchdog).

Only one Scheduler lives in a process at a time (sglang's runtime context is process-global).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

from replay.backends.ipc import remove_ipc_files
from replay.backends.sglang.loop import SCHEDULER_BACKENDS, SglangBackend
from replay.backends.sglang.tokens import EOS_TOKEN_ID

#: Vocabulary of the config written for the Scheduler; token ids are validated only against
#: the scheduler's model config, whose ``vocab_size`` is widened to the synthesized range.
_VOCAB = 64


def write_model_config(model_dir: Path, *, sliding_window_tokens: int) -> Path:
    """Write the ``config.json`` the Scheduler's ``ModelConfig`` reads (no weights).

    SWA runs get a ``MellumForCausalLM`` with one sliding and one full attention layer (an
    architecture sglang detects as hybrid SWA); runs without SWA a 1-layer ``LlamaForCausalLM``.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    common = {"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 1, "num_key_value_heads": 1,
              "head_dim": 8, "vocab_size": _VOCAB, "max_position_embeddings": 1 << 24,
              "torch_dtype": "float32", "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": EOS_TOKEN_ID,
              "hidden_act": "silu", "tie_word_embeddings": False}
    if sliding_window_tokens > 0:
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        cfg = dict(common, architectures=["MellumForCausalLM"], model_type="mellum", num_hidden_layers=2,
                   layer_types=["sliding_attention", "full_attention"], sliding_window=sliding_window_tokens,
                   mlp_layer_types=["dense"] * 2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                   rope_parameters={"full_attention": rope, "sliding_attention": rope})
    else:
        cfg = dict(common, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1,
                   rope_theta=10000.0)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    return model_dir


def server_argv(settings, model_dir: Path, *, max_context_tokens: int) -> list[str]:
    """The ``launch_server``-style arguments of the replay Scheduler for ``settings``."""
    s = settings
    argv = ["--model-path", str(model_dir), "--load-format", "dummy", "--skip-tokenizer-init",
            "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--dtype", "float32", "--grammar-backend", "none", "--disable-overlap-schedule",
            "--skip-server-warmup", "--random-seed", "0",
            "--page-size", str(s.page_size), "--max-total-tokens", str(s.full_pool_tokens),
            "--max-running-requests", str(s.max_running_requests),
            "--chunked-prefill-size", str(s.chunked_prefill_size),
            "--max-prefill-tokens", str(s.max_prefill_tokens),
            "--schedule-policy", s.schedule_policy, "--radix-eviction-policy", s.eviction_policy,
            "--context-length", str(max_context_tokens)]
    if s.has_swa:
        # The flag only sizes the pools of sglang's model runner, which the stand-in worker
        # replaces (the pools come from build_pools, sized by the settings); sglang refuses a
        # ratio above 1, which an SWA pool larger than the full pool would give.
        argv += ["--swa-full-tokens-ratio", repr(min(1.0, s.swa_tokens / s.full_pool_tokens))]
    if s.has_hicache:
        argv += ["--enable-hierarchical-cache", "--hicache-ratio", repr(s.host_pool_tokens / s.full_pool_tokens),
                 "--hicache-write-policy", s.hicache_write_policy, "--hicache-io-backend", "direct",
                 "--hicache-mem-layout", "layer_first"]
    return argv


class _Anything:
    """Attributes of the stand-in runner the replay never needs: ``None``."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return None


class _StandInRunner(_Anything):
    def __init__(self, pools, model_config) -> None:
        self.req_to_token_pool, self.token_to_kv_pool, self.token_to_kv_pool_allocator = pools
        self.model_config = model_config
        self.mtp_draft_device_pools = ()
        self.mtp_draft_mamba_pools = ()
        self.device = "cpu"
        self.forward_stream = None
        self.memory_pool_config = object()

    def prewarm_sampling(self) -> None:
        return None


class _StandInWorker(_Anything):
    """The model worker of a replay: pools from the settings, tokens from the workload."""

    def __init__(self, backend: RealSchedulerBackend, pools, model_config, settings) -> None:
        self.backend = backend
        self.model_runner = _StandInRunner(pools, model_config)
        self.model_config = model_config
        self.is_hybrid_swa = settings.has_swa
        self.sliding_window_size = settings.sliding_window_tokens if settings.has_swa else None
        self._tokens_per_layer = (settings.full_pool_tokens, settings.swa_tokens)
        self.weight_load_time = 0.0
        self.graph_time_usage = {}
        self.graph_memory_usage = {}
        self.preloaded_weights_bytes = 0
        self.hicache_layer_transfer_counter = None

    def get_memory_pool(self):
        return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

    def get_tokens_per_layer_info(self):
        return self._tokens_per_layer

    def get_pad_input_ids_func(self):
        return None

    def register_hicache_layer_transfer_counter(self, counter) -> None:
        """HiCache: the tree's layer-done counter (``TpModelWorker`` keeps it the same way)."""
        self.hicache_layer_transfer_counter = counter

    def set_hicache_consumer(self, consumer_index: int) -> None:
        if self.hicache_layer_transfer_counter is not None:
            self.hicache_layer_transfer_counter.set_consumer(consumer_index)

    def forward_batch_generation(self, batch, **kwargs):
        """No forward pass: each request's next token is its synthesized output token."""
        import torch
        from sglang.srt.managers.utils import GenerationBatchResult

        nxt = self.backend._next_token
        self.set_hicache_consumer(batch.hicache_consumer_index)  # as TpModelWorker does
        ids = [nxt(r) for r in batch.reqs]
        return GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64),
                                     can_run_cuda_graph=False)

    def forward_batch_split_prefill(self, batch):  # pragma: no cover - pdmux only
        raise NotImplementedError("split prefill is not replayed")


def _make_scheduler_class():
    """``Scheduler`` with the stand-in model worker (built once per process)."""
    from sglang.srt.managers.scheduler import Scheduler

    class ReplayScheduler(Scheduler):
        """sglang's Scheduler; only ``init_model_worker`` differs (see the module docstring)."""

        _kvtrace_backend: RealSchedulerBackend | None = None

        def init_model_worker(self):
            from sglang.srt.runtime_context import get_context, get_parallel
            from sglang.srt.layers.dp_attention import get_dp_tp_group

            backend = type(self)._kvtrace_backend
            s = backend.settings
            from replay.backends.sglang.build import build_pools

            pools = build_pools(s, req_rows=s.max_running_requests, row_tokens=backend._row_tokens)
            self.tp_worker = _StandInWorker(backend, pools, self.model_config, s)
            from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
                NgramEmbeddingManager,
            )

            self.tp_worker.model_runner.ngram_embedding_manager = NgramEmbeddingManager.from_model(
                model=None, model_config=self.model_config, req_to_token_pool=pools[0],
                max_running_requests=s.max_running_requests, device="cpu")
            self.maybe_init_draft_worker()  # no speculative decoding: no draft worker
            self.model_worker = self.tp_worker
            self.kv_cache_allocation_time = 0.0
            self.schedule_stream = None
            self.max_total_num_tokens = s.full_pool_tokens
            self.max_prefill_tokens = s.max_prefill_tokens
            self.max_running_requests = s.max_running_requests
            self.max_queued_requests = None
            self.max_req_len = backend._row_tokens - 1
            self.max_req_input_len = self.max_req_len - 5
            self.random_seed = 0
            self.device = "cpu"
            self.forward_stream = None
            self.min_free_slots_delayer = None
            par = get_parallel()
            if not par.pp_max_micro_batch_size:
                get_context().override("scheduler.pp_max_micro_batch_size_default",
                                       pp_max_micro_batch_size=max(self.max_running_requests // par.pp_size, 1))
                par = get_parallel()
            self.tp_group = par.tp_group
            self.tp_cpu_group = self.tp_group.cpu_group
            self.attn_tp_group = par.attn_tp_group
            self.attn_tp_cpu_group = self.attn_tp_group.cpu_group
            self.attn_cp_group = par.attn_cp_group
            self.attn_cp_cpu_group = self.attn_cp_group.cpu_group
            self.pp_group = par.pp_group
            self.world_group = par.world_group
            self.dp_tp_group = get_dp_tp_group()
            self.dp_tp_cpu_group = self.dp_tp_group.cpu_group
            self.pad_input_ids_func = None
            self.startup_available_gpu_memory_gb = 0.0

    return ReplayScheduler


_SCHEDULER_CLASS: list = []
_PARALLEL_READY: list = []  # non-empty once sglang's parallel groups exist in this process


def _discard_output(*args, **kwargs) -> None:
    """Outputs for the detokenizer: none runs; finishes are read from the requests."""
    return None


class RealSchedulerBackend(SglangBackend):
    """:class:`SglangBackend` whose steps are sglang's own ``Scheduler`` iterations.

    ``waiting``, ``running``, ``last_batch`` and ``chunked_req`` are the Scheduler's own
    ``waiting_queue``, ``running_batch``, ``last_batch`` and ``chunked_req``; ``sched`` is the
    Scheduler. Construct it through ``SglangBackend(workload, settings)`` with
    ``settings.scheduler == "real"`` (or directly).
    """

    # ---------------------------------------------------------------- the Scheduler's state
    waiting = property(lambda self: self.sched.waiting_queue,
                       lambda self, v: setattr(self.sched, "waiting_queue", v))
    running = property(lambda self: self.sched.running_batch,
                       lambda self, v: setattr(self.sched, "running_batch", v))
    last_batch = property(lambda self: self.sched.last_batch,
                          lambda self, v: setattr(self.sched, "last_batch", v))
    chunked_req = property(lambda self: self.sched.chunked_req,
                           lambda self, v: setattr(self.sched, "chunked_req", v))

    def _build(self, stack: contextlib.ExitStack, max_context_tokens: int) -> None:
        from replay.backends.sglang.build import Runtime

        s = self.settings
        self._row_tokens = -(-max_context_tokens // s.page_size) * s.page_size + s.page_size
        model_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvtrace-model-")))
        write_model_config(model_dir, sliding_window_tokens=s.sliding_window_tokens)
        self.sched = stack.enter_context(_scheduler(self, s, model_dir, self._row_tokens))
        sched = self.sched
        self.rt = Runtime(settings=s, server_args=sched.server_args, model_config=sched.model_config,
                          req_to_token_pool=sched.req_to_token_pool,
                          kv_pool=sched.tp_worker.model_runner.token_to_kv_pool,
                          allocator=sched.token_to_kv_pool_allocator, tree=sched.tree_cache,
                          policy=sched.policy, ratio=sched.new_token_ratio_tracker,
                          stats_observer=sched.pool_stats_observer, max_context_tokens=self._row_tokens)
        stack.callback(self.rt.close)
        window = getattr(sched.tree_cache, "sliding_window_size", None)
        if s.has_swa and window != s.sliding_window_tokens:
            raise RuntimeError(f"the Scheduler's tree has sliding window {window}, expected "
                               f"sliding_window_tokens={s.sliding_window_tokens}")

    # ---------------------------------------------------------------- one iteration
    def step(self):
        """One ``event_loop_normal`` iteration of the real Scheduler (see the module docstring)."""
        import dataclasses
        from time import perf_counter_ns

        t0 = perf_counter_ns()
        sched = self.sched
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        self._admit_arrivals()
        sched.metrics_reporter.num_retracted_reqs = 0
        plan = sched.get_next_batch_to_run(running_batch=sched.running_batch, last_batch=sched.last_batch)
        sched.running_batch = plan.running_batch
        batch = plan.batch_to_run
        num_retracted = int(sched.metrics_reporter.num_retracted_reqs or 0)
        self.result.num_retractions += num_retracted
        # update_running_batch reports a retract_decode abort (out of memory even alone) through
        # send_abort_output: report it where the mirror does (batch selected, nothing run yet).
        self._report_aborts("retract_oom")
        if batch is not None:
            record = self._run_real_batch(batch, num_retracted)
        else:
            sched._sched_idled = True
            sched.on_idle()
            record = self._idle_step(num_retracted)
        sched.last_batch = batch
        self._collect_finished(batch)
        self.forward_ct += 1
        record = dataclasses.replace(record, cpu_ns=perf_counter_ns() - t0)
        if self.observer is not None:
            self.observer.on_step(record, self)
        if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
            self.check_integrity()
        return record

    def close_step(self) -> None:
        """End the last step for the tracer hooks, whose boundary with the real Scheduler is the
        top of ``get_next_batch_to_run``: one more call, which with nothing waiting or running
        selects no batch (at the clock the last step ended at, as every other boundary)."""
        sched = self.sched
        begin = getattr(self.observer, "on_step_begin", None)
        if begin is not None:
            begin(self.clock_ns)
        plan = sched.get_next_batch_to_run(running_batch=sched.running_batch, last_batch=sched.last_batch)
        sched.running_batch = plan.running_batch
        if plan.batch_to_run is not None:
            raise RuntimeError("close_step: the Scheduler selected a batch after the run finished")
        sched.last_batch = None

    def _run_real_batch(self, batch, num_retracted: int):
        from replay.backends.sglang.loop import StepRecord

        self._idle_streak = 0
        extend = batch.forward_mode.is_extend()
        num_tokens = int(batch.extend_num_tokens) if extend else batch.batch_size()
        step_ns = self._charge(num_tokens)
        result = self.sched.run_batch(batch)
        self.sched.process_batch_result(batch, result)
        if extend:
            self.result.num_prefill_steps += 1
            self.result.prefill_tokens += num_tokens
        else:
            self.result.num_decode_steps += 1
            self.result.decode_tokens += num_tokens
        self.result.num_steps += 1
        self.result.clock_ns = self.clock_ns
        return StepRecord(self.forward_ct, "prefill" if extend else "decode", batch.batch_size(), num_tokens,
                          step_ns, self.clock_ns, num_retracted)

    def _collect_finished(self, batch) -> None:
        """Report the requests the iteration finished (released by ``process_batch_result``).
        A finish reason that is an abort counts as ``retract_oom``; a ``retract_decode`` abort
        itself leaves ``finished_reason`` unset and is reported by :meth:`_report_aborts`."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        if batch is None:
            return
        reqs = self._reqs
        for req in batch.reqs:  # only the batch's requests finish (in batch order, as the mirror)
            if req.rid in reqs and req.finished():
                del reqs[req.rid]
                aborted = isinstance(req.finished_reason, FINISH_ABORT)
                self._complete(req, "retract_oom" if aborted else "finished")

    def _to_tokenizer(self, output, recv_obj=None) -> None:
        """``send_to_tokenizer.send_output`` of the replay Scheduler: keep the ``AbortReq`` of a
        request it ended without a finish (``send_abort_output``); nothing else is consumed."""
        from sglang.srt.managers.io_struct import AbortReq

        if isinstance(output, AbortReq) and not output.abort_all:
            self._aborts.append(output)

    def _report_aborts(self, reason: str) -> None:
        """Complete the requests the Scheduler aborted since the last call, as ``reason``."""
        aborts, self._aborts = self._aborts, []
        for abort in aborts:
            req = self._reqs.pop(abort.rid, None)
            if req is not None:
                self._complete(req, reason)

    # ---------------------------------------------------------------- arrivals
    def _admit_arrivals(self) -> None:
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        from replay.backends.sglang.loop import _Active

        pending, inputs = self._pending, []
        while self._next_arrival < len(pending) and pending[self._next_arrival].arrival_ns <= self.clock_ns:
            wreq = pending[self._next_arrival]
            self._next_arrival += 1
            if self.observer is not None:
                self.observer.on_arrival(wreq, self.clock_ns)
            if self._refused_at_arrival(wreq):
                self._abort(self._make_req(wreq), "too_long", "prompt does not fit the full KV pool")
                continue
            sp = SamplingParams(max_new_tokens=wreq.max_new_tokens, temperature=0.0)
            sp.normalize(None)
            session = str(wreq.session_id) if wreq.session_id >= 0 else None
            inputs.append(TokenizedGenerateReqInput(
                rid=str(wreq.rid), input_text="", input_ids=self._synth.prompt_ids(wreq), input_embeds=None,
                mm_inputs=None, token_type_ids=None, sampling_params=sp, return_logprob=False,
                logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
                session_id=session))
            self._active[str(wreq.rid)] = _Active(wreq, self._synth.output_ids(wreq))
        if inputs:
            queue = self.sched.waiting_queue
            before = len(queue)
            self.sched.process_input_requests(inputs)
            for req in self.sched.waiting_queue[before:]:
                self._reqs[req.rid] = req
            missing = [i.rid for i in inputs if i.rid not in self._reqs]
            if missing:
                why = {a.rid: (a.finished_reason or {}).get("message") for a in self._aborts}
                raise RuntimeError(f"the Scheduler did not queue requests {missing[:5]} "
                                   f"(max_req_input_len={self.sched.max_req_input_len}; "
                                   f"abort messages: {[why.get(r) for r in missing[:5]]})")

    def _idle_step(self, num_retracted: int):
        record = super()._idle_step(num_retracted)
        for rid in [rid for rid, r in self._reqs.items() if r.finished()]:
            self._reqs.pop(rid)  # aborted as unschedulable by the base class
        return record


def _hook_scheduler_module() -> None:
    """Let installed tracer hooks wrap ``Scheduler`` (its module is imported only now, after a
    recording installed them): their step boundary is then the top of the real
    ``get_next_batch_to_run``, as in a server. Without it they would end a step at every
    ``get_pool_stats`` sglang's metrics code makes (several per iteration)."""
    import tracer.sglang

    if tracer.sglang.is_installed():
        tracer.sglang.install(check=False, lazy=True)


@contextlib.contextmanager
def _scheduler(backend: RealSchedulerBackend, settings, model_dir: Path, row_tokens: int):
    """Construct the replay Scheduler (process-global sglang context published for it)."""
    from sglang.srt.server_args import PortArgs, prepare_server_args
    from sglang.srt.runtime_context import SpawnRanks, publish

    args = prepare_server_args(server_argv(settings, model_dir, max_context_tokens=row_tokens))
    for name in ("resolve_once", "check_server_args"):
        fn = getattr(args, name, None)
        if fn is not None:
            fn()
    port_args = PortArgs.init_new(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    if not _SCHEDULER_CLASS:
        _SCHEDULER_CLASS.append(_make_scheduler_class())
    _hook_scheduler_module()
    cls = _SCHEDULER_CLASS[0]
    cls._kvtrace_backend = backend
    backend._reqs = {}
    backend._aborts = []
    from sglang.srt.distributed import bootstrap as dist

    original = dist.init_parallel_runtime
    if _PARALLEL_READY:
        # One process-wide world (tp=pp=dp=1, gloo on CPU) serves every replay Scheduler:
        # sglang refuses to build its groups twice, and a later Scheduler reuses them.
        dist.init_parallel_runtime = lambda **kwargs: None
    try:
        sched = cls(args, port_args)
        _PARALLEL_READY.append(True)
    finally:
        dist.init_parallel_runtime = original
        cls._kvtrace_backend = None
        remove_ipc_files(port_args)
    sched.model_config.vocab_size = 1 << 31  # synthesized ids; nothing is sampled from a model
    sched.ipc_channels.send_to_detokenizer.send_output = _discard_output
    sched.ipc_channels.send_to_tokenizer.send_output = backend._to_tokenizer
    from replay.backends.sglang import patches

    patches.apply_speed_patches(sched)
    import logging

    # The Scheduler logs every prefill and decode batch at INFO: a replay's progress bar and
    # summary would drown. Warnings still show; the level is restored after the run.
    sg_logger = logging.getLogger("sglang")
    level = sg_logger.level
    sg_logger.setLevel(max(logging.WARNING, level))
    try:
        yield sched
    finally:
        sg_logger.setLevel(level)
        with contextlib.suppress(Exception):
            sched.release_host_resources()
        _close_ipc(sched)


def _close_ipc(sched) -> None:
    """Disarm the Scheduler's watchdogs, and close what it opens for a server's other processes and
    never closes itself: its
    ZMQ sockets and their context (io threads, eventfds, ipc socket files) and the /dev/shm load
    snapshot. Without this every replay in a process left ~13 file descriptors and a /dev/shm
    file behind (a notebook or a test worker running many replays ran out of select()able fds)."""
    import zmq

    # sglang's watchdog threads (one per Scheduler, never stopped) SIGQUIT this process's PARENT
    # when the Scheduler looks active (a batch kept in cur_batch_for_debug) and forward_ct stands
    # still for watchdog_timeout: after a replay in a notebook that is the Jupyter server. Make
    # them inert and drop their references to the Scheduler (its pools stay alive otherwise).
    for name in ("watchdog", "soft_watchdog"):
        dog = getattr(sched, name, None)
        if dog is not None:
            dog.is_active = lambda: False
            dog.get_counter = lambda: 0
            dog.dump_info = None
    sched.cur_batch_for_debug = None

    ch = getattr(sched, "ipc_channels", None)
    sockets = []
    for name in ("recv_from_tokenizer", "recv_from_rpc", "send_to_tokenizer", "send_to_detokenizer",
                 "send_metrics_from_scheduler"):
        obj = getattr(ch, name, None)
        if not isinstance(obj, zmq.Socket):  # SenderWrapper (.socket)
            obj = getattr(obj, "socket", None)
        if isinstance(obj, zmq.Socket):
            sockets.append(obj)
    contexts = {id(sk.context): sk.context for sk in sockets}
    for sk in sockets:
        with contextlib.suppress(Exception):
            sk.close(linger=0)
    for ctx in contexts.values():
        with contextlib.suppress(Exception):
            ctx.term()
    from replay.backends.sglang.patches import drop_load_snapshot

    drop_load_snapshot(sched)  # its /dev/shm file too


SCHEDULER_BACKENDS["real"] = RealSchedulerBackend
