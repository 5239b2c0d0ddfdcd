"""Hooks on the fork's prefill admission (``sglang.srt.managers.schedule_policy.PrefillAdder``;
the fork has no ``prefill_budget`` module: its budgets are ``PrefillAdder`` properties): one
``admit`` ``sched`` row per ``add_one_req`` / ``add_chunked_req`` decision with the meaning of
0.5.23's rows (``hooks/schedule_policy.py``).

Columns: the prefix at entry (``len(req.prefix_indices)``), the tokens asked to prefill (the
extend less the host hit), the tokens admitted (0 when rejected), the verdict, the budgets left
after the decision (``rem_total_tokens``; ``rem_swa_tokens`` and the SWA need
``_swa_budget_for_req`` for SWA-hybrid models, else -1).

Verdicts: ``admitted`` (whole extend), ``chunked`` (cut by the chunk budget), ``shrunk`` (cut
below the chunk budget: #659's SWA-pressure cap ``_swa_chunk_cap``), ``swa_wait`` (rejected with
``NO_TOKEN`` although the total budget fit: the SWA budget did not), ``no_token``, ``other``.
A request that keeps waiting for the same outcome gets one row (as on 0.5.23).

Locks: the selection's temporary pin (``_lock_node``) leaves no ``cache`` rows
(``S.pin_select``); the admission's own lock ``_req_inc_lock_ref`` does (``S.pin_commit``).
"""

from __future__ import annotations

import tracer
from tracer.schema import SchedKind, Verdict
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S

MOD = "sglang.srt.managers.schedule_policy"
ADMIT = int(SchedKind.ADMIT)
V_ADMITTED, V_CHUNKED, V_SHRUNK = int(Verdict.ADMITTED), int(Verdict.CHUNKED), int(Verdict.SHRUNK)
V_NO_TOKEN, V_SWA_WAIT, V_OTHER = int(Verdict.NO_TOKEN), int(Verdict.SWA_WAIT), int(Verdict.OTHER)
P_ADD_ONE = "(self, req, has_chunked_req, truncation_align_size)"
_reads = ("can_run_list", "rem_total_tokens", "rem_chunk_tokens", "is_hybrid_swa", "page_size",
          "Req.prefix_indices", "Req.fill_ids", "Req.extend_input_len", "Req.host_hit_length")
CONTRACTS = contracts(
    MOD,
    dict(hook="sched.admission", cls="PrefillAdder", method="add_one_req",
         params=P_ADD_ONE, reads=_reads),
    dict(hook="sched.admission", cls="PrefillAdder", method="add_chunked_req",
         params="(self, req)", reads=_reads),
    dict(hook="sched.admission", cls="PrefillAdder", method="_req_inc_lock_ref",
         params="(self, req)"),
    # the SWA budget columns (need, shrunk / swa_wait) are read in the same wrapper
    dict(hook="sched.budget", cls="PrefillAdder", method="add_one_req", params=P_ADD_ONE,
         reads=("rem_swa_tokens", "_swa_budget_for_req", "Req.swa_host_hit_length")),
)

# rid -> (verdict-name, prefix, requested) of its last rejection row (repeats are not written)
_last_reject: dict[int, tuple] = {}


def _pre(adder, req, chunked: bool):
    """(rid, prefix, host_hit, requested, n0, rem_chunk, total_tokens, previous rid) or None."""
    try:
        prefix0 = len(req.prefix_indices)
        host_hit = 0 if chunked else int(req.host_hit_length or 0)
        requested = int(req.extend_input_len) - host_hit
        n0 = len(adder.can_run_list)
        rem_chunk = adder.rem_chunk_tokens
        max_new = max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)
        total = int(req.extend_input_len) + min(max_new, 4096) + adder.page_size
    except Exception as e:
        state.note_failure("fork.admission.pre", e)
        return None
    rid = state.rid_of(req)
    prev_rid, S.cur_rid = S.cur_rid, rid
    S.pin_select += 1
    return rid, prefix0, host_hit, requested, n0, rem_chunk, total, prev_rid


def _post(adder, req, chunked: bool, pre, out) -> None:
    rid, prefix0, host_hit, requested, n0, rem_chunk, total, prev_rid = pre
    S.pin_select -= 1
    S.cur_rid = prev_rid
    try:
        _emit(adder, req, rid, chunked, prefix0, host_hit, requested, n0, rem_chunk, total, out)
    except Exception as e:
        state.note_failure("fork.admission.add", e)


def _emit(adder, req, rid, chunked, prefix0, host_hit, requested, n0, rem_chunk, total, out):
    crl = adder.can_run_list
    admitted = len(crl) > n0 and crl[-1] is req
    ps = adder.page_size
    if admitted:
        _last_reject.pop(rid, None)
        prefix1 = len(req.prefix_indices)
        got = len(req.fill_ids) - prefix1
        if got >= requested:
            verdict = V_ADMITTED
        elif not chunked and rem_chunk is not None and \
                got < (prefix1 + rem_chunk) // ps * ps - prefix1:
            verdict = V_SHRUNK  # cut below the chunk budget: the SWA-pressure cap
        else:
            verdict = V_CHUNKED
    else:
        got = 0
        name = getattr(out, "name", "")
        key = (name, prefix0, requested)
        if _last_reject.get(rid) == key:
            return
        _last_reject[rid] = key
        if len(_last_reject) > 65536:
            _last_reject.clear()
        if chunked:
            verdict = V_NO_TOKEN
        elif name == "NO_TOKEN" and adder.is_hybrid_swa and total < adder.rem_total_tokens:
            verdict = V_SWA_WAIT  # the total budget fit; the SWA budget did not
        elif name == "NO_TOKEN":
            verdict = V_NO_TOKEN
        else:
            verdict = V_OTHER
    rem_total = int(adder.rem_total_tokens)
    if adder.is_hybrid_swa:
        rem_swa = int(adder.rem_swa_tokens)
        need = int(adder._swa_budget_for_req(-(-requested // ps) * ps,
                                             swa_host_hit_length=req.swa_host_hit_length))
    else:
        rem_swa = need = -1
    tracer.sched(ADMIT, S.forward_ct, 0, 0, 0, 0, rid, prefix0, requested, host_hit, requested,
                 got, verdict, rem_total, rem_swa, need)


def _make_add_one(orig):
    def add_one_req(self, req, has_chunked_req, truncation_align_size):
        pre = None if tracer.pool is NOOP else _pre(self, req, False)
        out = None
        try:
            out = orig(self, req, has_chunked_req, truncation_align_size)
            return out
        finally:
            if pre is not None:
                _post(self, req, False, pre, out)

    return add_one_req


def _make_add_chunked(orig):
    def add_chunked_req(self, req):
        pre = None if tracer.pool is NOOP else _pre(self, req, True)
        out = None
        try:
            out = orig(self, req)
            return out
        finally:
            if pre is not None:
                _post(self, req, True, pre, out)

    return add_chunked_req


def _make_commit(orig):
    def _req_inc_lock_ref(self, req):
        S.pin_commit += 1
        try:
            return orig(self, req)
        finally:
            S.pin_commit -= 1

    return _req_inc_lock_ref


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap ``PrefillAdder`` admission (not at ``steps``). Returns count."""
    if level == "steps":
        return 0
    sp = target(MOD, lazy)
    if sp is None:
        return 0
    A = sp.PrefillAdder
    n = patcher.wrap_method(A, "add_one_req", exact_only(P_ADD_ONE, _make_add_one))
    n += patcher.wrap_method(A, "add_chunked_req", exact_only("(self, req)", _make_add_chunked))
    n += patcher.wrap_method(A, "_req_inc_lock_ref", exact_only("(self, req)", _make_commit))
    return n
