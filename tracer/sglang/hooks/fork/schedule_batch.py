"""Hooks on the fork's ``sglang.srt.managers.schedule_batch``:

- ``Req.__init__``: the ``arrival`` row (``runtime.requests.emit_arrival``), every level;
- ``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode``: note the step's batch for its
  ``step`` row (``runtime.sampler.loop``); the decode allocation is measured on the allocator
  leaves (``fork/allocator.py`` wraps ``alloc_decode``), so nothing is measured here; at
  ``steps`` under the real ``Scheduler`` they only pass through (its boundary reads
  ``last_batch``);
- ``ScheduleBatch.release_req(idx, remaing_req_count, server_args)`` (retraction): a ``retract``
  ``sched`` row, ``counts``/``pages``;
- ``ScheduleBatch._evict_swa(req, pre_len)``, the decode out-of-window SWA release (inline
  before #659; at #659 it calls ``common.free_swa_out_of_window_slots``, also hooked in
  ``fork/common.py``, which then passes through): one ``swa_release`` row.
"""

from __future__ import annotations

import tracer
from tracer.schema import Mode, SchedKind
from tracer.sglang.hooks.fork import common as fork_common
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.hooks.schedule_batch import _arrival, _make_prepare
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_init

MOD = "sglang.srt.managers.schedule_batch"
PREFILL, DECODE = int(Mode.PREFILL), int(Mode.DECODE)
RETRACT = int(SchedKind.RETRACT)
P_RELEASE_REQ = "(self, idx, remaing_req_count, server_args)"
_all = ("steps", "counts", "pages")
CONTRACTS = contracts(
    MOD,
    dict(hook="request.arrival", cls="Req", method="__init__",
         reads=("rid", "origin_input_ids", "sampling_params"), levels=_all),
    dict(hook="sched.batch", cls="ScheduleBatch", method="prepare_for_extend",
         params="(self)", reads=("reqs", "extend_num_tokens"), levels=_all),
    dict(hook="sched.batch", cls="ScheduleBatch", method="prepare_for_decode",
         params="(self)", reads=("reqs",), levels=_all),
    dict(hook="sched.retract", cls="ScheduleBatch", method="release_req",
         params=P_RELEASE_REQ, reads=("reqs", "Req.cache_protected_len", "Req.kv_allocated_len")),
    dict(hook="cache.swa_release", cls="ScheduleBatch", method="_evict_swa",
         params="(self, req, pre_len)", reads=("Req.swa_evicted_seqlen",), optional=True,
         pools=("swa",)),
)


def _make_prepare_fork(mode: int, level: str):
    """0.5.23's prepare wrappers with the decode measurement off (the fork's leaves are
    measured on ``alloc_decode`` itself)."""
    inner = _make_prepare(PREFILL if mode == PREFILL else DECODE, level)
    if mode == PREFILL or level == "steps":
        return inner

    from tracer.sglang.runtime import sampler
    lp = sampler.loop

    def make(orig):
        def prepare_for_decode(self):
            if tracer.pool is NOOP:
                return orig(self)
            out = orig(self)
            try:
                if tracer.pool is not S.emit_key:
                    state.sync_recording()
                bs = len(self.reqs)
                if lp.mode == sampler.IDLE and lp.t0:  # (the common decode step)
                    lp.mode, lp.batch_size, lp.num_tokens = DECODE, bs, bs
                else:
                    lp.note_batch(DECODE, bs, bs)
            except Exception as e:
                state.note_failure("fork.stats.prepare", e)
            return out

        return prepare_for_decode

    return make


def _make_release_req(orig):
    def release_req(self, idx, remaing_req_count, server_args):
        if tracer.pool is not NOOP:
            try:
                req = self.reqs[idx]
                prefix = int(req.cache_protected_len)
                held = int(req.kv_allocated_len)
                tracer.sched(RETRACT, S.forward_ct, 0, 0, 0, 0, state.rid_of(req), prefix,
                             max(0, held - prefix), 0, 0, 0, 0, -1, -1, -1)
            except Exception as e:
                state.note_failure("fork.admission.retract", e)
        return orig(self, idx, remaing_req_count, server_args)

    return release_req


def _make_evict_swa(orig):
    def _evict_swa(self, req, pre_len):
        if tracer.pool is NOOP:
            return orig(self, req, pre_len)
        return fork_common.swa_release(req, lambda: orig(self, req, pre_len))

    return _evict_swa


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the fork's ``Req`` / ``ScheduleBatch`` (``lazy``: only if imported). Returns count."""
    sb = target(MOD, lazy)
    if sb is None:
        return 0
    B = sb.ScheduleBatch
    n = patcher.wrap_method(sb.Req, "__init__", after_init("request.arrival", _arrival))
    n += patcher.wrap_method(B, "prepare_for_extend",
                             exact_only("(self)", _make_prepare_fork(PREFILL, level)))
    n += patcher.wrap_method(B, "prepare_for_decode",
                             exact_only("(self)", _make_prepare_fork(DECODE, level)))
    if level == "steps":
        return n
    n += patcher.wrap_method(B, "release_req", exact_only(P_RELEASE_REQ, _make_release_req))
    # (at #659 _evict_swa calls common.free_swa_out_of_window_slots, also hooked: the outer
    # release writes the row, fork_common.swa_release)
    n += patcher.wrap_method(B, "_evict_swa", exact_only("(self, req, pre_len)", _make_evict_swa))
    return n
