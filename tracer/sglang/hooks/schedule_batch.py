"""Hooks on ``sglang.srt.managers.schedule_batch``: ``Req``, ``ScheduleBatch`` and the
module function ``release_req``.

- ``Req.__init__``: the ``arrival`` row of a new request (``runtime.requests.emit_arrival``);
  every level;
- ``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode`` (no arguments in 0.5.23): note
  the step's batch for its ``step`` row (``runtime.sampler.loop``); at ``counts``/``pages`` the
  decode one also measures the decode allocation (``allocator_decode.measure_decode``); at
  ``steps``, where no pool rows mark the pools changed, a batch marks them for the sampler, and
  under the real ``Scheduler`` (whose boundary reads the batch that ran) they only pass through;
- ``release_req`` (retraction: frees a running request for decode memory): a ``retract``
  ``sched`` row; ``counts``/``pages`` only.
"""

from __future__ import annotations

import tracer
from tracer.schema import Mode, SchedKind
from tracer.sglang.hooks import allocator_decode
from tracer.sglang.hooks.allocator_decode import measure_decode
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import requests, sampler, state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.targets.contract import LEVELS, Contract
from tracer.sglang.wrappers import after_init

IDLE, PREFILL, DECODE = int(Mode.IDLE), int(Mode.PREFILL), int(Mode.DECODE)
RETRACT = int(SchedKind.RETRACT)

_SB = "sglang.srt.managers.schedule_batch"
CONTRACTS: tuple[Contract, ...] = (
    Contract("request.arrival", _SB, "Req", "__init__", levels=LEVELS),
    Contract("sched.batch", _SB, "ScheduleBatch", "prepare_for_extend", params="(self)",
             reads=("reqs", "extend_num_tokens"), levels=LEVELS),
    Contract("sched.batch", _SB, "ScheduleBatch", "prepare_for_decode", params="(self)",
             reads=("reqs",), levels=LEVELS),
    Contract("sched.retract", _SB, None, "release_req",
             reads=(_SB + ":ReqKvInfo.kv_allocated_len", _SB + ":ReqKvInfo.cache_protected_len")),
) + allocator_decode.CONTRACTS


def _arrival(req) -> None:
    if tracer.pool is not NOOP:
        requests.emit_arrival(req)


def _make_prepare(mode: int, level: str):
    """Hand-written (once per step, exact parameters)."""
    decode = mode == DECODE
    steps = level == "steps"  # no pool rows: a batch marks the pools changed
    lp = sampler.loop

    def make(orig):
        if steps:
            def prepare_steps(self):
                # The real Scheduler's boundary reads the batch itself (``last_batch``).
                if lp.scheduler_driven or tracer.pool is NOOP:
                    return orig(self)
                out = orig(self)
                S.dirty = True
                try:
                    note(self)
                except Exception as e:
                    state.note_failure("stats.prepare", e)
                return out

            return prepare_steps

        def prepare(self):
            if tracer.pool is NOOP:
                return orig(self)
            out = measure_decode(self, orig) if decode else orig(self)
            try:
                note(self)
            except Exception as e:
                state.note_failure("stats.prepare", e)
            return out

        return prepare

    def note(batch) -> None:
        if tracer.pool is not S.emit_key:
            state.sync_recording()
        bs = len(batch.reqs)
        if not decode:
            lp.note_batch(mode, bs, int(batch.extend_num_tokens or 0))
        elif lp.mode == IDLE and lp.t0:  # the common decode step
            lp.mode, lp.batch_size, lp.num_tokens = mode, bs, bs
        else:
            lp.note_batch(mode, bs, bs)

    return make


def _make_release_req():
    """Retraction row (rare: not a hot path)."""

    def make(orig):
        def release_req(*args, **kwargs):
            if tracer.pool is NOOP:
                return orig(*args, **kwargs)
            req = kwargs.get("req")
            try:
                rid = state.rid_of(req)
                prefix = int(req.kv.cache_protected_len)
                held = int(req.kv.kv_allocated_len)
                tracer.sched(RETRACT, S.forward_ct, 0, 0, 0, 0, rid, prefix,
                             max(0, held - prefix), 0, 0, 0, 0, -1, -1, -1)
            except Exception as e:
                state.note_failure("admission.retract", e)
            return orig(*args, **kwargs)

        return release_req

    return make


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap ``Req``/``ScheduleBatch`` (``lazy``: only if already imported). Returns count."""
    sb = target("sglang.srt.managers.schedule_batch", lazy)
    if sb is None:
        return 0
    n = patcher.wrap_method(sb.Req, "__init__", after_init("request.arrival", _arrival))
    n += patcher.wrap_method(sb.ScheduleBatch, "prepare_for_extend",
                             exact_only("(self)", _make_prepare(PREFILL, level)))
    n += patcher.wrap_method(sb.ScheduleBatch, "prepare_for_decode",
                             exact_only("(self)", _make_prepare(DECODE, level)))
    if level != "steps":
        n += patcher.wrap_function(sb, "release_req", _make_release_req())
    return n
