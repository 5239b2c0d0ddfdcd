"""Fixtures of the tracer-hook tests: real sglang objects built with the hooks installed.

The objects come from the real-code backend's builder (``replay.backends.sglang.build``), which
constructs them as sglang's own test kits do; tests then drive the real allocator, host pool and
tree methods directly.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

import tracer  # noqa: E402
import tracer.sglang as hooks  # noqa: E402
from replay.backends.sglang.env import bootstrap  # noqa: E402


def torch_ints(values):
    import torch

    return torch.tensor(values, dtype=torch.int64)


@contextlib.contextmanager
def recording(path: Path, *, stats_interval_ms: float = 0.0, **options):
    """Hooks installed and the recorder running into ``path`` (stopped and uninstalled after).

    ``stats_interval_ms=0``: a stats sample at every ``step``/``sample`` where something changed.
    """
    bootstrap()
    hooks.install()
    old = hooks.configure()
    hooks.configure(stats_interval_ms=stats_interval_ms)
    hooks.failures.clear()
    tracer.start(path, source="sglang-hooks", hash_block_tokens=16, **options)
    try:
        yield path
    finally:
        tracer.stop()
        hooks.configure(stats_interval_ms=old["stats_interval_ms"])
        hooks.uninstall()


@contextlib.contextmanager
def runtime(**settings):
    """Real pools/allocator/tree of the backend builder for ``SglangSettings(**settings)``."""
    from replay.backends.sglang.build import build_runtime, sglang_env
    from replay.backends.sglang.settings import SglangSettings

    s = SglangSettings(**settings)
    with sglang_env(s, debug_memory_pool=True):
        rt = build_runtime(s, max_context_tokens=1024)
        try:
            yield rt
        finally:
            rt.close()


def extend(allocator, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]):
    """``alloc_extend`` for a batch (CPU tensors; ``last_locs`` -1 for no prefix)."""
    p, s = torch_ints(prefix_lens), torch_ints(seq_lens)
    return allocator.alloc_extend(p, p, s, s, torch_ints(last_locs), int(sum(seq_lens) - sum(prefix_lens)))


def used(allocator) -> dict[str, int]:
    """Live capacity - available per device pool of an allocator."""
    if hasattr(allocator, "swa_available_size"):
        return {"full": allocator.size_full - allocator.full_available_size(),
                "swa": allocator.size_swa - allocator.swa_available_size()}
    return {"full": allocator.size - allocator.available_size()}
