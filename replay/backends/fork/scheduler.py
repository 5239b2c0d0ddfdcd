"""The fork's own ``Scheduler`` on CPU with the forward replaced (runs in the fork's process).

:func:`make_scheduler` builds ``sglang.srt.managers.scheduler.Scheduler`` (the fork's: constructor
``(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, attn_cp_rank, moe_dp_rank,
dp_rank)``) through a subclass whose only change is ``init_tp_model_worker``: it installs
:class:`StandInWorker` instead of a ``TpModelWorker``. The rest of ``init_model_worker`` is the
fork's own (it unpacks the worker's 12-tuple ``get_worker_info``, takes the process groups
:func:`replay.backends.fork.dsv4_pools.ensure_parallel` made); the tree (and, with HiCache, the
host pools: ``LogicalHostPool`` anchor, ``DeepSeekV4PagedHostPool``, state pools) is built by
the fork's ``kv_cache_builder.build_kv_cache``.

The stand-in worker's pools come from :func:`replay.backends.fork.dsv4_pools.build_runner` (the
fork's configurator path); its ``forward_batch_generation`` returns, per request, the token
``next_token(req)`` gives (no model). ``SGLANG_ENABLE_UNIFIED_RADIX_TREE=1`` is set by
:func:`make_scheduler` unless the caller's environment sets it.
"""

from __future__ import annotations

import os
from typing import Callable


class StandInWorker:
    """The model worker: the configurator-built pools, no weights, tokens from ``next_token``."""

    def __init__(self, runner, server_args, next_token: Callable) -> None:
        self.model_runner = runner
        self.model_config = runner.model_config
        self.server_args = server_args
        self._next_token = next_token
        self.is_hybrid_swa = bool(runner.is_hybrid_swa)
        self.sliding_window_size = runner.model_config.sliding_window_size if self.is_hybrid_swa else None
        self.hicache_layer_transfer_counter = None
        for name, value in (("forward_stream", None), ("graph_mem_usage", 0.0), ("weight_load_mem_usage", 0.0),
                            ("lora_manager", None), ("model", None), ("token_table", None),
                            ("linear_attn_model_spec", None), ("hisparse_coordinator", None),
                            ("device_timer", None), ("mamba2_config", None)):
            if not hasattr(runner, name):
                setattr(runner, name, value)
        pool = runner.req_to_token_pool
        self.max_total_num_tokens = int(runner.max_total_num_tokens)
        self.max_running_requests = int(server_args.max_running_requests)
        self.max_req_len = int(pool.max_context_len) - 1
        self.max_req_input_len = self.max_req_len - 5

    def get_worker_info(self):
        """The 12-tuple of ``TpModelWorker.get_worker_info`` at both shared commits."""
        r = self.model_runner
        return (self.max_total_num_tokens, self.server_args.max_prefill_tokens, self.max_running_requests, None,
                self.max_req_len, self.max_req_input_len, 0, "cpu", None, r.req_to_token_pool.size,
                r.req_to_token_pool.max_context_len, r.token_to_kv_pool.size)

    def get_memory_pool(self):
        return self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool_allocator

    def get_tokens_per_layer_info(self):
        r = self.model_runner
        if self.is_hybrid_swa:
            return r.full_max_total_num_tokens, r.swa_max_total_num_tokens
        return self.max_total_num_tokens, None

    def get_pad_input_ids_func(self):
        return None

    def register_hicache_layer_transfer_counter(self, counter) -> None:
        self.hicache_layer_transfer_counter = counter

    def set_hicache_consumer(self, consumer_index: int) -> None:
        if self.hicache_layer_transfer_counter is not None:
            self.hicache_layer_transfer_counter.set_consumer(consumer_index)

    def forward_batch_generation(self, batch, **kwargs):
        """No forward pass: one token per request from ``next_token``."""
        import torch
        from sglang.srt.managers.utils import GenerationBatchResult

        index = getattr(batch, "hicache_consumer_index", -1)
        if index is not None and index >= 0:
            self.set_hicache_consumer(index)
        ids = [self._next_token(r) for r in batch.reqs]
        return GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False)


_CLASS: list = []


def scheduler_class():
    """The fork's ``Scheduler`` with :class:`StandInWorker` (made once per process)."""
    if not _CLASS:
        from sglang.srt.managers.scheduler import Scheduler

        class KvtraceForkScheduler(Scheduler):
            """The fork's Scheduler; only ``init_tp_model_worker`` differs (see module doc)."""

            _kvtrace_worker_factory: Callable | None = None

            def init_tp_model_worker(self):
                self.tp_worker = type(self)._kvtrace_worker_factory(self.server_args)

        _CLASS.append(KvtraceForkScheduler)
    return _CLASS[0]


def make_scheduler(server_args, *, next_token: Callable, max_total_tokens: int | None = None):
    """Build the fork's Scheduler on the configurator-built pools (see module doc).

    Returns:
        the Scheduler; ``sched.tp_worker.model_runner`` holds the pools.
    """
    os.environ.setdefault("SGLANG_ENABLE_UNIFIED_RADIX_TREE", "1")
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import PortArgs, set_global_server_args_for_scheduler

    from replay.backends.fork.dsv4_pools import build_runner, ensure_parallel
    from replay.backends.ipc import remove_ipc_files

    set_global_server_args_for_scheduler(server_args)
    ensure_parallel(server_args, ModelConfig.from_server_args(server_args))
    cls = scheduler_class()

    def factory(args):
        return StandInWorker(build_runner(args, max_total_tokens=max_total_tokens), args, next_token)

    cls._kvtrace_worker_factory = staticmethod(factory)
    port_args = PortArgs.init_new(server_args)
    try:
        return cls(server_args, port_args, 0, 0, 0, 0, 0, 0, None)
    finally:
        remove_ipc_files(port_args)


def build_scheduler(kind: str, *, sliding_window_tokens: int, next_token: Callable, max_total_tokens: int,
                    **server_kwargs):
    """A model directory of ``kind`` written to a temporary directory, the server args for it
    (:func:`replay.backends.fork.dsv4_pools.make_server_args` with ``server_kwargs``) and
    :func:`make_scheduler` on them. The directory is read only while the Scheduler is built and
    is removed then (each run left a ``kvtrace-fork-model-*`` directory in /tmp before).

    Returns:
        ``(server_args, scheduler)``.
    """
    import tempfile

    from replay.backends.fork.dsv4_pools import make_server_args, write_model_dir

    with tempfile.TemporaryDirectory(prefix="kvtrace-fork-model-") as tmp:
        args = make_server_args(write_model_dir(tmp, kind, sliding_window_tokens=sliding_window_tokens),
                                max_total_tokens=max_total_tokens, **server_kwargs)
        return args, make_scheduler(args, next_token=next_token, max_total_tokens=max_total_tokens)


__all__ = ["StandInWorker", "build_scheduler", "make_scheduler", "scheduler_class"]
