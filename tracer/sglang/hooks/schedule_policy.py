"""Hooks on prefill admission (``sglang.srt.managers.schedule_policy.PrefillAdder`` and
``sglang.srt.mem_cache.prefill_budget.PrefillBudget``): ``admit`` ``sched`` rows. Retraction rows
are written by ``schedule_batch.py`` (``release_req``). ``counts``/``pages`` only.

One ``admit`` row per ``PrefillAdder.add_one_req`` / ``add_chunked_req`` call, with the request's
prefix, the tokens it asked to prefill (``chunk_requested``), the tokens admitted
(``chunk_admitted``, 0 when rejected), the verdict and the budgets left after the decision
(``rem_total``; ``rem_swa`` and the SWA need for SWA-hybrid models).

Verdicts: ``admitted`` (whole extend), ``chunked`` (cut by the chunk budget), ``shrunk`` (cut by
the SWA budget: ``SWAPrefillBudget.check_prefill`` returned a cap below the chunk limit),
``swa_wait`` (the total budget fit but the SWA budget did not, so the request waits),
``no_token`` (total budget), ``other`` (batch/chunk/input limits).

The budget check is observed by wrapping ``PrefillBudget.check_prefill`` (and overrides): it only
keeps the arguments and result; the SWA need (the budget's own ``swa_tokens``) and the remaining
budgets are read only for rows that are written. A request that keeps waiting for the same reason
(same verdict, prefix and request) gets one row, not one per step. The selection's temporary pin
of the candidate's prefix (a lock and unlock inside ``add_one_req``) leaves no ``cache`` rows; the
admission's own lock (``_commit_prefill_admission``) does.
"""

from __future__ import annotations


import tracer
from tracer.schema import SchedKind, Verdict
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.targets.contract import Contract

ADMIT = int(SchedKind.ADMIT)
V_ADMITTED, V_CHUNKED, V_SHRUNK = int(Verdict.ADMITTED), int(Verdict.CHUNKED), int(Verdict.SHRUNK)
V_NO_TOKEN, V_SWA_WAIT, V_OTHER = int(Verdict.NO_TOKEN), int(Verdict.SWA_WAIT), int(Verdict.OTHER)

_SP, _PB = "sglang.srt.managers.schedule_policy", "sglang.srt.mem_cache.prefill_budget"
_REQ = "sglang.srt.managers.schedule_batch:Req."
_ADDER_READS = ("can_run_list", "memory_budget", "rem_total_tokens", _REQ + "prefix_len",
                _REQ + "full_untruncated_fill_ids", _REQ + "extend_end")
_CHECK_PARAMS = ("(self, *, extend_input_len, total_tokens, max_new_tokens, input_tokens, "
                 "swa_host_hit_length, chunk_limit, auxiliary_swa_host_hit_length=0)")
CONTRACTS: tuple[Contract, ...] = (
    Contract("sched.admission", _SP, "PrefillAdder", "add_one_req",
             params="(self, req, has_chunked_req, truncation_align_size)", reads=_ADDER_READS),
    Contract("sched.admission", _SP, "PrefillAdder", "add_chunked_req", params="(self, req)"),
    Contract("sched.admission", _SP, "PrefillAdder", "_commit_prefill_admission",
             params="(self, req, admission, mamba_gap_reserve)"),
    Contract("sched.budget", _PB, "PrefillBudget", "check_prefill", params=_CHECK_PARAMS,
             reads=("remaining_total",)),
)


class _Check:
    """The last budget check inside the admission in progress (values read lazily, only for
    rows that are written): whether one is being watched, the budget, its arguments and its
    result ``(can_admit, limit_out)``."""

    __slots__ = ("active", "budget", "kwargs", "result")

    def __init__(self):
        self.active = False
        self.budget = self.kwargs = self.result = None


_chk = _Check()
# rid -> (verdict, prefix_len, requested) of its last rejection row (repeats are not written)
_last_reject: dict[int, tuple] = {}


def _make_check_prefill():
    def make(orig):
        def check_prefill(self, *, extend_input_len, total_tokens, max_new_tokens, input_tokens,
                          swa_host_hit_length, chunk_limit, auxiliary_swa_host_hit_length=0):
            out = orig(self, extend_input_len=extend_input_len, total_tokens=total_tokens,
                       max_new_tokens=max_new_tokens, input_tokens=input_tokens,
                       swa_host_hit_length=swa_host_hit_length, chunk_limit=chunk_limit,
                       auxiliary_swa_host_hit_length=auxiliary_swa_host_hit_length)
            chk = _chk
            if chk.active:
                chk.budget, chk.result = self, out
                chk.kwargs = {"extend_input_len": extend_input_len, "total_tokens": total_tokens,
                           "max_new_tokens": max_new_tokens, "chunk_limit": chunk_limit,
                           "swa_host_hit_length": swa_host_hit_length}
            return out

        return check_prefill

    return make



def _swa_needed(budget, kw) -> int:
    """SWA tokens the checked extend needs (the budget's own estimate), -1 without SWA."""
    if budget is None or kw is None or not hasattr(budget, "swa_tokens"):
        return -1
    ps = budget.page_size
    ext = kw.get("extend_input_len", 0)
    return int(budget.swa_tokens(-(-ext // ps) * ps, kw.get("max_new_tokens", 0),
                                 chunk_limit=kw.get("chunk_limit"),
                                 swa_host_hit_length=kw.get("swa_host_hit_length", 0)))


def _budgets(adder) -> tuple[int, int]:
    b = adder.memory_budget
    rem_total = int(adder.rem_total_tokens)
    rem_swa = int(b.remaining_swa) if hasattr(b, "swa_tokens") else -1
    return rem_total, rem_swa


def _admit_pre(adder, req, chunked: bool):
    """Before an admission attempt: (rid, prefix, host_hit, requested, n0, previous rid), or
    None when the request cannot be read (the attempt then runs unobserved)."""
    try:
        prefix0 = int(req.prefix_len)
        host_hit = 0 if chunked else int(getattr(req, "host_hit_length", 0) or 0)
        requested = len(req.full_untruncated_fill_ids) - prefix0 - host_hit
        n0 = len(adder.can_run_list)
    except Exception as e:
        state.note_failure("admission.pre", e)
        return None
    rid = state.rid_of(req)
    chk = _chk
    chk.active = True
    chk.budget = chk.kwargs = chk.result = None
    prev_rid, S.cur_rid = S.cur_rid, rid
    S.pin_select += 1
    return rid, prefix0, host_hit, requested, n0, prev_rid


def _admit_post(adder, req, chunked: bool, pre, out) -> None:
    rid, prefix0, host_hit, requested, n0, prev_rid = pre
    S.pin_select -= 1
    S.cur_rid = prev_rid
    chk = _chk
    chk.active = False
    try:
        _emit_admit(adder, req, rid, chunked, prefix0, host_hit, requested, n0, out, chk)
    except Exception as e:
        state.note_failure("admission.add", e)


def _make_add_one():
    """``add_one_req(req, has_chunked_req, truncation_align_size)``."""

    def make(orig):
        def add_one_req(self, req, has_chunked_req, truncation_align_size):
            pre = None if tracer.pool is NOOP else _admit_pre(self, req, False)
            out = None
            try:
                out = orig(self, req, has_chunked_req, truncation_align_size)
                return out
            finally:
                if pre is not None:
                    _admit_post(self, req, False, pre, out)

        return add_one_req

    return make


def _make_add_chunked():
    """``add_chunked_req(req)``: the continuing chunk of a chunked prefill."""

    def make(orig):
        def add_chunked_req(self, req):
            pre = None if tracer.pool is NOOP else _admit_pre(self, req, True)
            out = None
            try:
                out = orig(self, req)
                return out
            finally:
                if pre is not None:
                    _admit_post(self, req, True, pre, out)

        return add_chunked_req

    return make


def _make_commit():
    """The admission's own lock (``_commit_prefill_admission``) is recorded, unlike the pin."""

    def make(orig):
        def commit(self, req, admission, mamba_gap_reserve):
            S.pin_commit += 1
            try:
                return orig(self, req, admission, mamba_gap_reserve)
            finally:
                S.pin_commit -= 1

        return commit

    return make


def _emit_admit(adder, req, rid, chunked, prefix0, host_hit, requested, n0, out, chk) -> None:
    budget, kw, result = chk.budget, chk.kwargs, chk.result
    can_admit, limit_out = result if result is not None else (True, None)
    limit_in = kw.get("chunk_limit") if kw else None
    admitted = len(adder.can_run_list) > n0 and adder.can_run_list[-1] is req
    if admitted:
        _last_reject.pop(rid, None)
        got = int(req.extend_end) - int(req.prefix_len)
        if got >= requested:
            verdict = V_ADMITTED
        elif limit_out is not None and (limit_in is None or limit_out < limit_in):
            verdict = V_SHRUNK
        else:
            verdict = V_CHUNKED
    else:
        got = 0
        name = getattr(out, "name", "")
        # Dedupe on cheap values first: the same request waiting for the same outcome of the
        # same budget check gets one row (reading the budgets costs tree and allocator calls).
        key = (name, can_admit, prefix0, requested)
        if _last_reject.get(rid) == key:
            return
        _last_reject[rid] = key
        if len(_last_reject) > 65536:
            _last_reject.clear()
        if chunked:
            verdict = V_NO_TOKEN
        elif name == "NO_TOKEN" and budget is not None and not can_admit and hasattr(
                budget, "swa_tokens") and kw.get("total_tokens", 0) < budget.remaining_total:
            verdict = V_SWA_WAIT  # the total budget fit; the SWA budget did not
        elif name == "NO_TOKEN":
            verdict = V_NO_TOKEN
        else:
            verdict = V_OTHER
    rem_total, rem_swa = _budgets(adder)
    tracer.sched(ADMIT, S.forward_ct, 0, 0, 0, 0, rid, prefix0, requested,
                 host_hit, requested, got, verdict, rem_total, rem_swa, _swa_needed(budget, kw))


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap ``PrefillAdder`` admission and the prefill budgets (not at ``steps``). Returns count."""
    n = 0
    if level == "steps":
        return 0
    sp = target("sglang.srt.managers.schedule_policy", lazy)
    if sp is not None:
        A = sp.PrefillAdder
        n += patcher.wrap_method(A, "add_one_req", exact_only(
            "(self, req, has_chunked_req, truncation_align_size)", _make_add_one()))
        n += patcher.wrap_method(A, "add_chunked_req", exact_only("(self, req)", _make_add_chunked()))
        n += patcher.wrap_method(A, "_commit_prefill_admission", exact_only(
            "(self, req, admission, mamba_gap_reserve)", _make_commit()))
    pb = target("sglang.srt.mem_cache.prefill_budget", lazy)
    if pb is not None:
        n += patcher.wrap_method_tree(pb.PrefillBudget, "check_prefill",
                                      exact_only(_CHECK_PARAMS, _make_check_prefill()))
    return n
