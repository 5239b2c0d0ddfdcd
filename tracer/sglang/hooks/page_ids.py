"""``detail="pages"``: the page ids of device allocator ops (a device-to-host copy per op).

Frees: the ids a leaf really puts back on its free list, collected by the inner
``_release_page_ids`` (paged) or ``free`` (token) call of the op. Allocations: the head of the
free list before the call (allocation takes from the head), or the returned slots of ``alloc``.
"""

from __future__ import annotations

from tracer.sglang.runtime import state


def ids_numpy(tensors):
    import numpy as np

    parts = [t.reshape(-1).cpu().numpy() for t in tensors if t is not None and t.numel()]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


def alloc_page_ids(a, name: str, fp0, k_pages: int, out):
    """Page ids an allocation took: the head of the free list before the call (no merge)."""
    fp = a.free_pages
    try:
        if fp0 is not None and fp0.shape[0] - k_pages == fp.shape[0] and (
            fp.shape[0] == 0
            or fp.untyped_storage().data_ptr() == fp0.untyped_storage().data_ptr()
        ):
            return ids_numpy([fp0[:k_pages]])
        if name == "alloc" and out is not None:
            return ids_numpy([out[:: a.page_size] // a.page_size])
    except Exception as e:
        state.note_failure("allocator.page_ids", e)
    return None


def capture_inner(a, name: str, args, cap: list) -> None:
    """Remember the page/slot ids a leaf really puts back on its free list."""
    try:
        if name == "_release_page_ids":
            cap.extend(args)
        elif name == "free" and "staged_pages" not in a.__dict__ and a.free_group is None and args:
            cap.append(args[0])  # TokenToKVPoolAllocator: slot ids are page ids (ps=1)
    except Exception as e:
        state.note_failure("allocator.capture", e)
