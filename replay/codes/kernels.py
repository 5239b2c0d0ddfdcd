"""CPU stand-ins applied inside a code's process, after its sglang is importable.

Two kinds, both patches of the imported modules (the code's files are never edited):

- **Allocator kernels** (:func:`install_allocator_fallbacks`): the fork's
  ``mem_cache/allocator.py`` launches ``alloc_extend_kernel[(bs,)](...)`` and
  ``alloc_decode_kernel[(bs,)](...)`` on every paged allocation, with no torch path. Each is
  replaced by a launchable object computing the same output with torch: extend by the code's own
  ``alloc_extend_naive`` (same arguments), decode by :func:`alloc_decode_torch` (written here from
  the kernel's contract: a request whose new token starts a page gets the next free page's first
  slot, in batch order; any other gets ``last_loc + 1``).
- **Host data copies** (:func:`install_host_copy_noops`): in ``mem_cache.memory_pool_host``,
  every class's ``backup_from_device_all_layer`` / ``load_to_device_per_layer`` (KV *data*
  movement) becomes a no-op, and pinned host buffers are allocated without
  ``cudaHostRegister``. Slot allocation, tree state, locks and acks stay the code's own.

Imports torch and the code's modules lazily (inside the functions).
"""

from __future__ import annotations

import importlib

#: (module, attribute) of the kernels replaced by :func:`install_allocator_fallbacks`.
ALLOCATOR_KERNELS: tuple[tuple[str, str], ...] = (
    ("sglang.srt.mem_cache.allocator", "alloc_extend_kernel"),
    ("sglang.srt.mem_cache.allocator", "alloc_decode_kernel"),
)

#: Methods of the host pools that move KV data (no-ops on CPU).
HOST_COPY_METHODS: tuple[str, ...] = ("backup_from_device_all_layer", "load_to_device_per_layer")


def alloc_decode_torch(seq_lens, last_loc, free_pages, out_indices, page_size: int) -> None:
    """Torch equivalent of the paged ``alloc_decode_kernel``: one new slot per request.

    Request ``i`` holds ``seq_lens[i] - 1`` tokens and gets one more. When that token opens a
    new page (``(seq_lens[i] - 1) % page_size == 0``) it takes ``free_pages[k] * page_size``,
    ``k`` counting the page-opening requests before it; otherwise ``last_loc[i] + 1``.
    """
    import torch

    seq = seq_lens.to(torch.int64)
    pre = seq - 1
    new_page = (seq + page_size - 1) // page_size - (pre + page_size - 1) // page_size
    start = torch.cumsum(new_page, 0) - new_page
    n = int(new_page.sum())
    if n:
        take = start.clamp(max=max(len(free_pages) - 1, 0))
        from_free = free_pages[take].to(torch.int64) * page_size
    else:
        from_free = torch.zeros_like(seq)
    out = torch.where(new_page > 0, from_free, last_loc.to(torch.int64) + 1)
    out_indices[: len(seq)] = out.to(out_indices.dtype)


class _Launchable:
    """``kernel[grid](*args)`` calling a torch function with the kernel's arguments."""

    def __init__(self, name: str, fn) -> None:
        self.__name__ = name
        self._fn = fn

    def __getitem__(self, grid):
        return self._fn

    def __repr__(self) -> str:
        return f"<kvtrace torch fallback {self.__name__}>"


def _extend_launcher(naive):
    def launch(prefix_lens, seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
        if len(prefix_lens) == 0:
            return
        naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, out_indices.device)
    return launch


def _decode_launcher(seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
    if len(seq_lens):
        alloc_decode_torch(seq_lens, last_loc, free_pages, out_indices, int(page_size))


def install_allocator_fallbacks() -> tuple[str, ...]:
    """Replace the paged allocator's Triton kernels by torch (idempotent).

    Returns:
        ``module:attribute`` names replaced (empty when the module has no such kernels, e.g. a
        code whose allocator has its own torch path).
    Raises:
        RuntimeError: the module has ``alloc_extend_kernel`` but no ``alloc_extend_naive``.
    """
    mod = importlib.import_module("sglang.srt.mem_cache.allocator")
    done = []
    if hasattr(mod, "alloc_extend_kernel"):
        naive = getattr(mod, "alloc_extend_naive", None)
        if naive is None:
            raise RuntimeError("sglang.srt.mem_cache.allocator has alloc_extend_kernel but no alloc_extend_naive "
                               "(kvtrace's CPU fallback calls it)")
        if not isinstance(mod.alloc_extend_kernel, _Launchable):
            mod.alloc_extend_kernel = _Launchable("alloc_extend_kernel", _extend_launcher(naive))
        done.append("sglang.srt.mem_cache.allocator:alloc_extend_kernel")
    if hasattr(mod, "alloc_decode_kernel"):
        if not isinstance(mod.alloc_decode_kernel, _Launchable):
            mod.alloc_decode_kernel = _Launchable("alloc_decode_kernel", _decode_launcher)
        done.append("sglang.srt.mem_cache.allocator:alloc_decode_kernel")
    return tuple(done)


def _noop(*args, **kwargs) -> None:
    """A host<->device KV data copy on CPU: nothing to move."""
    return None


def _alloc_unregistered(dims, dtype, device, pin_memory, allocator):
    """``alloc_with_host_register`` without ``cudaHostRegister`` (no CUDA on CPU)."""
    return allocator.allocate(dims, dtype=dtype, device=device)


def install_host_copy_noops() -> tuple[str, ...]:
    """No-op the host pools' data copies and the pinned-buffer registration (idempotent).

    Returns:
        ``module:qualname`` names patched.
    """
    name = "sglang.srt.mem_cache.memory_pool_host"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError:
        return ()
    done = []
    base = getattr(mod, "HostKVCache", object)  # leaf pools move data; groups only dispatch to them
    for cls_name, cls in sorted(vars(mod).items()):
        if not isinstance(cls, type) or cls.__module__ != name or not issubclass(cls, base):
            continue
        for meth in HOST_COPY_METHODS:
            if meth in cls.__dict__:
                if cls.__dict__[meth] is not _noop:
                    setattr(cls, meth, _noop)
                done.append(f"{name}:{cls_name}.{meth}")
    if hasattr(mod, "alloc_with_host_register"):
        mod.alloc_with_host_register = _alloc_unregistered
        funcs = getattr(mod, "ALLOC_MEMORY_FUNCS", None)
        if funcs is not None and hasattr(funcs, "default_factory"):
            funcs.default_factory = lambda: _alloc_unregistered
            for key in list(funcs):
                if funcs[key].__name__ == "alloc_with_host_register":
                    funcs[key] = _alloc_unregistered
        done.append(f"{name}:alloc_with_host_register")
    return tuple(done)


__all__ = ["ALLOCATOR_KERNELS", "HOST_COPY_METHODS", "alloc_decode_torch", "install_allocator_fallbacks",
           "install_host_copy_noops"]
