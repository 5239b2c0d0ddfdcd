"""Policy knobs of DESIGN.md §5 that sglang 0.5.23 has no switch for, as small patches.

Each patch changes one decision of the real code and delegates everything else to it; none
re-implements a class. They are applied per backend run by :func:`apply_patches` (only the ones
the settings ask for; the defaults are 0.5.23's own behaviour and patch nothing) and removed on
exit, innermost first.

| setting | value | patch | reproduces |
|---|---|---|---|
| ``swa_lru_refresh`` | ``full_ancestry`` | the SWA component instance's ``refresh_lru`` becomes the base ``TreeComponent.refresh_lru`` (every walked node and the whole path to the root move to MRU). Python tree core only: the Rust core refreshes inside Rust | before sgl-project/sglang#26615 |
| ``host_free`` | ``eager_cat`` | each host pool instance's ``free`` runs the real ``free`` and then the real ``_merge_release_slots`` (one ``torch.cat`` of the whole free list per free) | before #30658 |
| ``swa_admission`` | ``all_or_nothing`` / ``shrink_always`` | ``SWAPrefillBudget.swa_never_fits`` (the gate of 0.5.23's chunk shrink) answers ``False`` (never shrink: an extend whose SWA need does not fit waits) or ``True`` (shrink whenever it does not fit); ``shrink_never_fits`` is 0.5.23's own gate and patches nothing | before sgl-project/sglang#31681 / before its #32700 gate |
| ``swa_release_boundary`` | ``window_plus_page_cut_to_window`` | ``free_swa_out_of_window_slots`` (in ``mem_cache.common`` and its import in ``components.swa``) is called with ``supports_prefix_sharing=False``, so a radix cache frees up to ``pre_len - W`` instead of ``pre_len - ceil_page(max(W, ps))`` | the W + ps margin cut to W, before #29860 |

Instance patches resolve the class method at call time (``type(obj).free``), so tracer hooks
wrapping the classes stay in the call path whichever is installed first.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass(frozen=True)
class PatchInfo:
    """One listed patch."""

    setting: str
    value: str
    target: str
    reproduces: str


PATCHES: tuple[PatchInfo, ...] = (
    PatchInfo("swa_lru_refresh", "full_ancestry",
              "SWAComponent instance .refresh_lru -> TreeComponent.refresh_lru (python tree core)",
              "full-ancestry SWA LRU refresh (pre sgl-project/sglang#26615)"),
    PatchInfo("host_free", "eager_cat",
              "host pool instance .free -> free + _merge_release_slots",
              "eager host free-list concatenation (pre #30658)"),
    PatchInfo("swa_admission", "all_or_nothing",
              "SWAPrefillBudget.swa_never_fits -> False (never shrink a chunk under SWA pressure)",
              "all-or-nothing SWA admission (pre sgl-project/sglang#31681)"),
    PatchInfo("swa_admission", "shrink_always",
              "SWAPrefillBudget.swa_never_fits -> True (shrink whenever the SWA need does not fit)",
              "ungated chunk shrink (#31681 before the #32700 gate)"),
    PatchInfo("swa_release_boundary", "window_plus_page_cut_to_window",
              "mem_cache.common / components.swa free_swa_out_of_window_slots(supports_prefix_sharing=False)",
              "out-of-window release boundary pre_len - W (pre #29860)"),
)


#: Parts of sglang's own ``Scheduler`` a replay turns off for speed, applied to every
#: ``scheduler=real`` backend (not a policy knob, not in a run's ``patches``): each only feeds a
#: server's other processes and is read by no scheduling or memory decision.
#: tests/sglang/test_backend_speed_patches.py checks that a replay with them is unchanged.
SPEED_PATCHES: tuple[PatchInfo, ...] = (
    PatchInfo("scheduler", "real",
              "Scheduler.load_snapshot_writer -> None (as on a scheduler that is not rank 0): "
              "publish_load_snapshot returns before SchedulerLoadInquirer.get_loads, an O(waiting "
              "queue) walk (read-only) encoded into a /dev/shm slot for a router, every 15th "
              "decode step (load_snapshot_publish_interval) and after every prefill",
              "no router or DP balancer reads a replay's load snapshot"),
    PatchInfo("scheduler", "real",
              "Scheduler.load_inquirer._get_num_pending_tokens -> 0 (the inquirer, a frozen "
              "slots dataclass, is rebuilt as a subclass with the same fields): the "
              "sum of Req.seqlen over the whole waiting queue that _get_new_batch_prefill_raw "
              "computes at every prefill for PrefillStats.num_pending_tokens, read only by the "
              "'#pending-token' field of the prefill log line",
              "a replay logs no prefill line (the sglang logger is at WARNING during a run)"),
)


def drop_load_snapshot(sched) -> None:
    """:data:`SPEED_PATCHES`: close the Scheduler's load-snapshot writer and remove its /dev/shm
    file now (``Scheduler.publish_load_snapshot`` returns None without one)."""
    import os

    writer = getattr(sched, "load_snapshot_writer", None)
    if writer is None:
        return
    sched.load_snapshot_writer = None
    with contextlib.suppress(Exception):
        writer.close()
    path = getattr(writer, "path", None)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


def skip_pending_tokens(sched) -> None:
    """:data:`SPEED_PATCHES`: the pending-token count of the prefill log line is not computed (an
    O(waiting queue) sum at every prefill: 15 % of a step in production_1h's overloaded hour,
    where thousands of requests wait). No decision reads it."""
    import dataclasses

    inquirer = getattr(sched, "load_inquirer", None)
    if inquirer is None or not hasattr(inquirer, "_get_num_pending_tokens"):
        return
    cls = type(inquirer)
    sub = _no_pending_classes.get(cls)
    if sub is None:  # (a slots dataclass: the subclass adds no slot, only the override)
        sub = _no_pending_classes[cls] = type(f"NoPending{cls.__name__}", (cls,), {
            "__slots__": (), "_get_num_pending_tokens": lambda self, chunk_deduct=0: 0})
    sched.load_inquirer = sub(**{f.name: getattr(inquirer, f.name) for f in dataclasses.fields(inquirer) if f.init})


_no_pending_classes: dict = {}


def apply_speed_patches(sched) -> None:
    """Every :data:`SPEED_PATCHES` entry, on a freshly built ``Scheduler``."""
    drop_load_snapshot(sched)
    skip_pending_tokens(sched)


@contextlib.contextmanager
def _full_ancestry_refresh(tree) -> Iterator[None]:
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType, TreeComponent

    if tree._tree_core_backend != "python":
        raise ValueError("swa_lru_refresh=full_ancestry needs the Python tree core (tree_core=python)")
    comp = tree.components[ComponentType.SWA]
    comp.refresh_lru = types.MethodType(TreeComponent.refresh_lru, comp)
    try:
        yield
    finally:
        del comp.refresh_lru


def _eager_free(pool, indices) -> int:
    """The real host ``free`` followed by the real merge: one whole-list cat per free."""
    freed = type(pool).free(pool, indices)
    with pool.lock:
        pool._merge_release_slots()
    return freed


@contextlib.contextmanager
def _eager_host_free(host_pools: dict) -> Iterator[None]:
    pools = list(host_pools.values())
    for pool in pools:
        pool.free = functools.partial(_eager_free, pool)
    try:
        yield
    finally:
        for pool in pools:
            del pool.free


def _window_only_boundary(original: Callable) -> Callable:
    @functools.wraps(original)
    def free_swa_out_of_window_slots(req, pre_len, **kwargs):
        kwargs["supports_prefix_sharing"] = False
        return original(req, pre_len, **kwargs)

    free_swa_out_of_window_slots.__kvtrace_patch__ = "swa_release_boundary"
    return free_swa_out_of_window_slots


@contextlib.contextmanager
def _prefix_release_boundary() -> Iterator[None]:
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.unified_cache.components import swa

    orig_common, orig_swa = common.free_swa_out_of_window_slots, swa.free_swa_out_of_window_slots
    wrapper = _window_only_boundary(orig_common)
    # One object in both modules when they held one, so hooks installed later rebind both.
    common.free_swa_out_of_window_slots = wrapper
    swa.free_swa_out_of_window_slots = wrapper if orig_swa is orig_common else _window_only_boundary(orig_swa)
    try:
        yield
    finally:
        swa.free_swa_out_of_window_slots = orig_swa
        common.free_swa_out_of_window_slots = orig_common


@contextlib.contextmanager
def _swa_admission(value: str) -> Iterator[None]:
    from sglang.srt.mem_cache.prefill_budget import SWAPrefillBudget

    answer = value == "shrink_always"

    def swa_never_fits(self, extend_input_len, max_new_tokens, **kwargs):
        return answer

    swa_never_fits.__kvtrace_patch__ = "swa_admission"
    original = SWAPrefillBudget.__dict__["swa_never_fits"]
    SWAPrefillBudget.swa_never_fits = swa_never_fits
    try:
        yield
    finally:
        SWAPrefillBudget.swa_never_fits = original


@contextlib.contextmanager
def apply_patches(settings, rt) -> Iterator[list[PatchInfo]]:
    """Apply the patches ``settings`` asks for to the run's real objects.

    Args:
        settings: :class:`replay.backends.sglang.settings.SglangSettings`.
        rt: the run's :class:`replay.backends.sglang.build.Runtime`.
    Yields:
        the applied :class:`PatchInfo` entries.
    Mutates:
        the SWA component / host pool instances of ``rt`` and, for the release boundary, two
        module attributes of sglang; all restored on exit.
    """
    applied = []
    with contextlib.ExitStack() as stack:
        if settings.swa_lru_refresh == "full_ancestry" and settings.has_swa:
            stack.enter_context(_full_ancestry_refresh(rt.tree))
            applied.append(PATCHES[0])
        if settings.host_free == "eager_cat" and rt.host_pools:
            stack.enter_context(_eager_host_free(rt.host_pools))
            applied.append(PATCHES[1])
        if settings.swa_admission != "shrink_never_fits" and settings.has_swa:
            stack.enter_context(_swa_admission(settings.swa_admission))
            applied.append(next(p for p in PATCHES if p.value == settings.swa_admission))
        if settings.swa_release_boundary == "window_plus_page_cut_to_window" and settings.has_swa:
            stack.enter_context(_prefix_release_boundary())
            applied.append(PATCHES[-1])
        yield applied
