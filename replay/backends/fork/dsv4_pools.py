"""The fork's DeepSeek-V4 memory pools, built by the fork's own configurator path (in its process).

``ServerArgs`` (a tiny ``DeepseekV4ForCausalLM`` config: the fork's DSV4 defaults force page 256,
the ``dsv4`` backend, fp8 KV and ratio 0.1) → ``ModelConfig`` → ``create_memory_pool_configurator``
(``DSV4PoolConfigurator``) → ``calculate_pool_sizes_from_max_tokens`` →
``ModelRunnerKVCacheMixin._apply_memory_pool_config`` → ``_init_pools`` on :class:`StandInRunner`
(the attributes ``_init_pools`` reads, no model). Gives ``ReqToTokenPool``,
``DeepSeekV4TokenToKVPool`` and the paged ``SWATokenToKVPoolAllocator``.

The same runner builds the MHA / SWA (non-DSV4) pools of a tiny Llama / Laguna config
(:func:`write_model_dir`'s ``kind``), by ``HybridSWAPoolConfigurator`` / ``DefaultPoolConfigurator``.

Everything from sglang is imported inside functions (this module imports without the fork).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The tiny DSV4 config (shared README): 4 layers, compress ratios [0, 4, 128, 4], window 128.
DSV4_CONFIG: dict = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "index_head_dim": 128, "index_n_heads": 1, "index_topk": 64, "compress_ratios": [0, 4, 128, 4],
    "sliding_window": 128, "window_size": 128, "vocab_size": 1024, "max_position_embeddings": 1 << 20,
    "n_routed_experts": 2, "num_experts_per_tok": 1, "n_shared_experts": 1, "o_groups": 1, "o_lora_rank": 64,
    "q_lora_rank": 64, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}

_COMMON = {"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 1, "num_key_value_heads": 1,
           "head_dim": 8, "vocab_size": 1024, "max_position_embeddings": 1 << 20, "torch_dtype": "float32",
           "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
           "tie_word_embeddings": False, "rope_theta": 10000.0}

KINDS = ("dsv4", "swa", "mha")


def model_config_dict(kind: str, *, sliding_window_tokens: int = 128) -> dict:
    """The ``config.json`` of a tiny model of ``kind`` (``dsv4``, ``swa``: Laguna, ``mha``: Llama)."""
    if kind == "dsv4":
        return dict(DSV4_CONFIG, sliding_window=sliding_window_tokens, window_size=sliding_window_tokens)
    if kind == "swa":
        return dict(_COMMON, architectures=["LagunaForCausalLM"], model_type="laguna", num_hidden_layers=2,
                    layer_types=["sliding_attention", "full_attention"], sliding_window=sliding_window_tokens,
                    mlp_layer_types=["dense", "dense"], num_experts=2, num_experts_per_tok=1,
                    moe_intermediate_size=8)
    if kind == "mha":
        return dict(_COMMON, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1)
    raise ValueError(f"model kind {kind!r}: expected one of {KINDS}")


def write_model_dir(model_dir: str | Path, kind: str, **kw) -> Path:
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config_dict(kind, **kw), indent=1))
    return model_dir


def make_server_args(model_dir: str | Path, *, page_size: int | None = None, max_total_tokens: int = 16384,
                     swa_full_tokens_ratio: float | None = None, max_running_requests: int = 16,
                     chunked_prefill_size: int = 512, max_prefill_tokens: int = 4096, context_length: int = 8192,
                     hicache_host_tokens: int = 0, hicache_write_policy: str = "write_through", **extra):
    """``ServerArgs`` for CPU (the fork's own defaults, then ``attention_backend=torch_native``).

    ``page_size`` is forced to 256 by the DSV4 defaults; ``hicache_host_tokens > 0`` turns HiCache
    on with ``hicache_ratio = host / max_total_tokens``.
    """
    from sglang.srt.server_args import ServerArgs

    kw = dict(model_path=str(model_dir), load_format="dummy", skip_tokenizer_init=True, device="cpu",
              attention_backend="torch_native", sampling_backend="pytorch", grammar_backend="none",
              disable_overlap_schedule=True, skip_server_warmup=True, random_seed=0,
              max_total_tokens=max_total_tokens, max_running_requests=max_running_requests,
              chunked_prefill_size=chunked_prefill_size, max_prefill_tokens=max_prefill_tokens,
              context_length=context_length, disable_cuda_graph=True)
    if page_size is not None:
        kw["page_size"] = page_size
    if swa_full_tokens_ratio is not None:
        kw["swa_full_tokens_ratio"] = swa_full_tokens_ratio
    if hicache_host_tokens > 0:
        kw.update(enable_hierarchical_cache=True, hicache_ratio=hicache_host_tokens / max_total_tokens,
                  hicache_write_policy=hicache_write_policy, hicache_io_backend="direct",
                  hicache_mem_layout="layer_first")
    kw.update(extra)
    args = ServerArgs(**kw)
    # The DSV4 defaults pick the dsv4 backend, whose support_triton() routes write_cache_indices
    # to a Triton kernel; CPU takes the torch path.
    args.attention_backend = "torch_native"
    return args


class StandInRunner:
    """What ``ModelRunnerKVCacheMixin._init_pools`` reads of a ``ModelRunner``; no model.

    Built as a subclass of the fork's mixin by :func:`runner_class` (so ``_init_pools`` and
    ``_apply_memory_pool_config`` are the fork's own methods).
    """

    def _setup(self, server_args, model_config) -> None:
        import torch

        self.server_args = server_args
        self.model_config = model_config
        self.device = "cpu"
        self.gpu_id = 0
        self.page_size = server_args.page_size
        self.is_hybrid_swa = model_config.is_hybrid_swa
        self.is_hybrid_swa_compress = getattr(model_config, "is_hybrid_swa_compress", False)
        self.is_draft_worker = False
        self.mambaish_config = None
        self.hybrid_gdn_config = None
        self.use_mla_backend = False
        self.enable_hisparse = False
        self.spec_algorithm = _NoSpec()
        self.dp_size = 1
        self.pp_size = 1
        self.tp_size = 1
        self.start_layer = 0
        self.end_layer = model_config.num_hidden_layers
        self.num_effective_layers = model_config.num_hidden_layers
        self.req_to_token_pool = None
        self.token_to_kv_pool_allocator = None
        self.max_running_requests = server_args.max_running_requests
        dtype = server_args.kv_cache_dtype
        self.kv_cache_dtype = {"fp8_e4m3": torch.float8_e4m3fn, "auto": torch.float32,
                               "bfloat16": torch.bfloat16}.get(dtype, torch.float32)
        self.dtype = torch.float32
        self.mem_fraction_static = 0.9


class _NoSpec:
    def is_none(self) -> bool:
        return True

    def is_eagle(self) -> bool:
        return False

    def __getattr__(self, attr: str):
        if attr.startswith("is_"):
            return lambda: False
        raise AttributeError(attr)


_RUNNER_CLASS: list = []
_PARALLEL: list = []


def ensure_parallel(server_args, model_config) -> None:
    """The process groups a real ``ModelRunner`` creates, for world size 1 on gloo (once per process):
    ``init_distributed_environment`` → ``initialize_model_parallel`` → ``initialize_dp_attention``."""
    if _PARALLEL:
        return
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.dp_attention import initialize_dp_attention

    # port 0: the store binds a free port itself (a port picked free and bound a moment later can
    # be taken in between by another process: EADDRINUSE, as the fork's own scheduler hit in CI)
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="tcp://127.0.0.1:0")
    initialize_model_parallel()
    initialize_dp_attention(server_args, model_config)
    _PARALLEL.append(True)


def runner_class():
    """``StandInRunner`` mixed with the fork's ``ModelRunnerKVCacheMixin`` (made once)."""
    if not _RUNNER_CLASS:
        from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin

        _RUNNER_CLASS.append(type("KvtraceStandInRunner", (StandInRunner, ModelRunnerKVCacheMixin), {}))
    return _RUNNER_CLASS[0]


def build_runner(server_args, *, max_total_tokens: int | None = None):
    """Build the pools by the fork's configurator path; returns the runner (pools on it).

    Args:
        server_args: from :func:`make_server_args`.
        max_total_tokens: the full pool's tokens; default ``server_args.max_total_tokens``.
    """
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(server_args)  # the DSV4 pool reads it (ring sizes)
    model_config = ModelConfig.from_server_args(server_args)
    ensure_parallel(server_args, model_config)
    runner = runner_class()()
    runner._setup(server_args, model_config)
    configurator = create_memory_pool_configurator(runner)
    config = configurator.calculate_pool_sizes_from_max_tokens(
        max_total_tokens or server_args.max_total_tokens, server_args.page_size)
    config.max_running_requests = server_args.max_running_requests
    runner.memory_pool_config = config
    runner.configurator_name = type(configurator).__name__
    runner._apply_memory_pool_config(config)
    return runner


def describe_pools(kv_pool, allocator, req_to_token_pool=None) -> dict:
    """Classes and sizes of the pools (JSON-able)."""
    out = {"kv_pool": type(kv_pool).__name__, "allocator": type(allocator).__name__,
           "page_size": int(getattr(allocator, "page_size", 1))}
    if req_to_token_pool is not None:
        out["req_to_token_pool"] = type(req_to_token_pool).__name__
        out["req_rows"] = int(req_to_token_pool.size)
    for name in ("full_size", "swa_size", "c4_size", "c128_size", "c4_state_pool_size", "c128_state_pool_size",
                 "size", "swa_page_size"):
        value = getattr(kv_pool, name, None)
        if isinstance(value, int):
            out[name] = value
    out["available"] = available(allocator)
    return out


def available(allocator) -> dict:
    """``{"full": n, "swa": m}`` (``swa`` only for an SWA allocator)."""
    if hasattr(allocator, "full_available_size"):
        return {"full": int(allocator.full_available_size()), "swa": int(allocator.swa_available_size())}
    return {"full": int(allocator.available_size())}


def pools_summary(*, kind: str = "dsv4", max_total_tokens: int = 16384, swa_full_tokens_ratio: float | None = None,
                  page_size: int | None = None, max_running_requests: int = 16, sliding_window_tokens: int = 128,
                  model_dir: str | None = None) -> dict:
    """Build the pools of ``kind`` (direct mode) in this process; returns :func:`describe_pools` plus
    the configurator's name and config. Entry point for ``call_in_code``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvtrace-fork-model-") as tmp:
        mdir = write_model_dir(model_dir or tmp, kind, sliding_window_tokens=sliding_window_tokens)
        args = make_server_args(mdir, page_size=page_size, max_total_tokens=max_total_tokens,
                                swa_full_tokens_ratio=swa_full_tokens_ratio,
                                max_running_requests=max_running_requests)
        runner = build_runner(args)
        out = describe_pools(runner.token_to_kv_pool, runner.token_to_kv_pool_allocator, runner.req_to_token_pool)
        out["configurator"] = runner.configurator_name
        out["server_args"] = {"page_size": args.page_size, "swa_full_tokens_ratio": args.swa_full_tokens_ratio,
                              "kv_cache_dtype": args.kv_cache_dtype, "attention_backend": args.attention_backend}
        return out


__all__ = ["DSV4_CONFIG", "KINDS", "StandInRunner", "available", "build_runner", "describe_pools",
           "make_server_args", "model_config_dict", "pools_summary", "runner_class", "write_model_dir"]
