"""Run inside a code's process: which of its modules import (``call_in_code(code, "replay.codes.probe:imports")``)."""

from __future__ import annotations

import importlib
import time

#: The modules capture and replay use (mem_cache, managers, the pool configurator path).
CORE_MODULES: tuple[str, ...] = (
    "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool", "sglang.srt.mem_cache.memory_pool_host",
    "sglang.srt.mem_cache.common", "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.kv_cache_builder", "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy", "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.pool_configurator", "sglang.srt.model_executor.model_runner_kv_cache_mixin",
)


def imports(modules: list[str] | None = None) -> dict:
    """Import each module; returns ``{"sglang_file", "ok": [...], "failed": {name: error}, "import_s"}``."""
    import sglang

    t0 = time.perf_counter()
    ok, failed = [], {}
    for name in modules or CORE_MODULES:
        try:
            importlib.import_module(name)
            ok.append(name)
        except Exception as exc:  # reported, not raised: the caller asserts on the table
            failed[name] = f"{type(exc).__name__}: {exc}"
    return {"sglang_file": sglang.__file__, "ok": ok, "failed": failed,
            "import_s": round(time.perf_counter() - t0, 3)}
