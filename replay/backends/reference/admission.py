"""Prefill admission of the reference scheduler: sglang 0.5.23's ``_get_new_batch_prefill_raw``
with ``PrefillAdder`` (``add_chunked_req``, ``add_one_req``) and ``SchedulePolicy.calc_priority``
(fcfs) restated, the admit rows written as the tracer's admission hook writes them, and the
extend allocation with ``alloc_for_extend``'s eviction demand.

A mixin of :class:`replay.backends.reference.scheduler.ReferenceBackend` (its state: ``model``,
``settings``, ``waiting``, ``running``, ``chunked_req``, ``batch_is_full``, ``ratio``).
"""

from __future__ import annotations

import tracer
from replay.backends.reference.budget import CLIP_MAX_NEW_TOKENS, PrefillBudget, ceil_page
from replay.backends.reference.coalesce import HeadRefusal
from replay.backends.reference.refresh import RefreshWindow
from replay.backends.reference.request import RefReq
from tracer.schema import CacheOp, SchedKind, Verdict

_WAITING_PREFIX_REFRESH_INTERVAL = 32  # sglang schedule_policy constants
_WAITING_QUEUE_PREFIX_MATCH_MAX = 128


class AdmissionMixin:
    """Prefill batch selection (see the module docstring)."""

    #: the last waiting-queue refresh's requests and walk memos (``refresh.RefreshWindow``), made
    #: at the first refresh that walks with the memo on
    _refresh_window: RefreshWindow | None = None
    #: refreshes answered by the window: no walk but the new requests' and the voided memos'
    #: (a diagnostic)
    refresh_reuses: int = 0

    def _allocatable(self, running_bs: int) -> int:
        return max(0, self.max_rows - running_bs)

    def _new_prefill_batch(self):
        s = self.settings
        if s.has_swa or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        if self._allocatable(len(self.running)) <= 0 and self.chunked_req is None:
            self.batch_is_full = True
            return None
        self._head_refusal = self._refused = None  # see ``coalesce.HeadRefusal``
        chunked_at_entry = self.chunked_req is not None
        self._touch_waiting_prefixes()
        budget = PrefillBudget(self.model, s, self.running, self.ratio.current)
        can_run: list[RefReq] = []
        extends: dict[int, int] = {}
        new_chunked = None
        if self.chunked_req is not None:
            req = self.chunked_req
            req.prefix_len = req.extend_end
            avail = budget.available_chunk_tokens()
            if avail is not None:
                remaining = req.fill_len - req.prefix_len
                n = min(remaining, avail)
                truncated = remaining > avail
                req.extend_end = req.prefix_len + n
                can_run.append(req)
                extends[req.rid] = n
                budget.reserve(n, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), budget.rem_chunk)
                self._emit_admit(req, req.prefix_len, remaining, 0, n,
                                 Verdict.CHUNKED if truncated else Verdict.ADMITTED, budget, -1)
                if not truncated:
                    self.chunked_req = None
            else:
                self._emit_admit(req, req.prefix_len, req.fill_len - req.prefix_len, 0, 0, Verdict.NO_TOKEN, budget,
                                 -1, ("", True))
        taken = 0  # the waiting requests admitted: a prefix of the queue (the walk stops at a refusal)
        for req in self.waiting:  # not changed during the walk (the queue is cut after it)
            # only ``other`` stops before the candidate: with ``no_token`` sglang still runs
            # ``add_one_req``, whose budget check refuses it (and the tracer records the row)
            if budget.state() == "other":
                break
            if len(can_run) >= self._allocatable(len(self.running)):
                self.batch_is_full = True
                break
            res = self._add_one_req(req, budget, can_run, extends)
            if can_run and can_run[-1] is req:
                taken += 1
            if res == "chunked":
                new_chunked = req
                res = budget.state()
            if res != "continue":
                if res == "no_token":
                    self.batch_is_full = bool(can_run) or bool(self.running)
                break
        if not can_run:
            if not chunked_at_entry:
                self._keep_head_refusal(walk_again=False)
            return None
        del self.waiting[:taken]
        self._keep_head_refusal(walk_again=True)  # this step's inserts may change its match
        if new_chunked is not None:
            self.chunked_req = new_chunked
        if self.chunked_req is not None:
            self.chunked_req.inflight_chunks += 1
        self._alloc_extend(can_run, extends)
        return can_run

    def _keep_head_refusal(self, walk_again: bool) -> None:
        """Keep this attempt's budget refusal as the head's memo (``coalesce.HeadRefusal``) when
        the request it refused heads the queue now, so that the next attempts may repeat its check
        in a stretch; with ``walk_again`` its match is walked again before use (version -1), else
        it stands for the tree as it is."""
        refused, tree = self._refused, self.model.tree
        if refused is not None and tree is not None and self.waiting and refused.req is self.waiting[0]:
            refused.version = -1 if walk_again else tree.version
            self._head_refusal = refused

    def _touch_waiting_prefixes(self) -> None:
        """``SchedulePolicy.calc_priority`` under fcfs (``_touch_waiting_prefixes``): every
        ``WAITING_PREFIX_REFRESH_INTERVAL``-th call with requests waiting, a tree walk of the first
        ``WAITING_QUEUE_PREFIX_MATCH_MAX`` waiting requests' whole token sequences, head last (it
        splits nodes and refreshes recency as a match does; the requests keep their state)."""
        if not self.waiting or self.settings.eviction_policy != "lru":
            return
        refresh = self._prefix_refresh_calls % _WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._prefix_refresh_calls += 1
        if refresh:
            tree = self.model.tree
            head = self.waiting[:_WAITING_QUEUE_PREFIX_MATCH_MAX]
            bests = self._window_bests(head)
            if bests is not None:
                tree.apply_touches(bests)
                return
            keys = [req.whole_keys() for req in reversed(head)]  # head last
            self.model.touch_many(keys)
            if tree is not None and tree.walk_memo:
                self._refresh_window.note(tree, head, keys, self.result.num_retractions)

    def _window_bests(self, head: list) -> list | None:
        """The best nodes of the refresh of ``head`` (the first waiting requests) in walk order,
        from the last refresh's window (``refresh.RefreshWindow``: only the new requests and the
        voided memos walked again, as pure reads) when no walk would split a node; else None (and
        with no tree, or with the walk memo off)."""
        tree = self.model.tree
        if tree is None or not tree.walk_memo:
            return None
        window = self._refresh_window
        if window is None:
            window = self._refresh_window = RefreshWindow()
        bests = window.bests(tree, head, self.result.num_retractions)  # retractions requeue
        if bests is not None:
            self.refresh_reuses += 1
        return bests

    def _check_refresh_window(self) -> None:
        """The refresh window's integrity against the queue as it is (``RefreshWindow.check_integrity``)."""
        if self._refresh_window is not None:
            self._refresh_window.check_integrity(self.model.tree, self.waiting[:_WAITING_QUEUE_PREFIX_MATCH_MAX],
                                                 self.result.num_retractions)

    def _add_one_req(self, req: RefReq, budget: PrefillBudget, can_run: list, extends: dict) -> str:
        """sglang ``init_next_round_input`` + ``add_one_req``: match, budget checks, lock."""
        s, ps, model = self.settings, self.settings.page_size, self.model
        keys = req.whole_keys()
        m = model.match(keys, max_tokens=req.fill_len - 1)
        tree = model.tree
        if tree is None:
            model.admit(req.rid, keys, m, max_match_tokens=req.fill_len - 1, prompt_tokens=req.input_len)
            req.in_model = True
        else:
            # The budget check reads the ledgers as the lock leaves them: check first with the
            # lock's evictable->protected move applied, lock only when admitted (a refused
            # request's lock + unlock leaves the tree, its leaf sets and victim order unchanged).
            budget.lock_full, budget.lock_swa = tree.lock_delta(m.last_device_node)
        req.prefix_len = m.device_hit_tokens
        req.host_hit, req.swa_host_hit = m.host_hit_tokens, m.swa_host_hit_tokens
        max_new = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        prefix = req.prefix_len + req.host_hit
        extend = req.fill_len - prefix
        total = req.fill_len - req.prefix_len + max_new + ps
        ok, chunk_limit, need = budget.check_prefill(extend, total, max_new, req.swa_host_hit, budget.rem_chunk)
        if tree is not None:
            budget.lock_full = budget.lock_swa = 0
            if ok:
                model.admit(req.rid, keys, m, max_match_tokens=req.fill_len - 1, prompt_tokens=req.input_len)
                req.in_model = True
        tracer.cache(int(CacheOp.MATCH), req.rid, m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens)
        if not ok:
            if req.in_model:
                self._unadmit(req)
            # swa_wait: the total budget fit and the SWA budget did not (the tracer hook's rule)
            verdict = Verdict.SWA_WAIT if (s.has_swa and total < budget.rem_total) else Verdict.NO_TOKEN
            self._refused = HeadRefusal(req, -1, keys, req.fill_len - 1, m, extend, total, max_new,
                                        req.swa_host_hit)
            self._emit_admit(req, req.prefix_len, extend, req.host_hit, 0, verdict, budget, need, ("NO_TOKEN", False))
            return "no_token"
        is_chunked = False
        if chunk_limit is not None and ceil_page(extend, ps) > chunk_limit:
            cut = chunk_limit // ps * ps
            extend = (prefix + cut) // ps * ps - prefix
            if extend <= 0:
                self._unadmit(req)
                self._emit_admit(req, req.prefix_len, req.fill_len - prefix, req.host_hit, 0, Verdict.OTHER, budget,
                                 need, ("OTHER", True))
                return "other"
            is_chunked, max_new = True, 0
        device_prefix, requested = req.prefix_len, req.fill_len - prefix
        if req.host_hit or req.swa_host_hit:
            loaded = model.load_back(req.rid)
            # the device room the load-back made (``_load_back_transfers``' ``evict_for_alloc``)
            for res in getattr(model.tree, "load_back_evicted", ()):
                self._emit_evict(res, req.rid)
            if loaded:
                tracer.cache(int(CacheOp.LOAD_BACK), req.rid, 0, 0, 0, loaded, 0, loaded)
            if loaded > req.host_hit:
                # the load exposed resident FULL behind host-only SWA: the budget check stands,
                # the work shrinks to what is left of the prompt (``add_one_req``)
                prefix = req.prefix_len + loaded
                extend = min(extend, req.fill_len - prefix)
                is_chunked = is_chunked and prefix + extend < req.fill_len
                req.prefix_len = prefix
            else:
                req.prefix_len += req.host_hit
        shrunk = is_chunked and chunk_limit is not None and chunk_limit < budget.rem_chunk
        req.extend_end = req.prefix_len + extend
        if req.first_prefix < 0:
            req.first_prefix = req.prefix_len
        if not req.retracted:
            req.cached_tokens = req.prefix_len
        can_run.append(req)
        extends[req.rid] = extend
        # ``_select_prefill_admission`` reserves the whole clipped ``max_new_tokens`` (not what is
        # left of it after a retraction), 0 for a chunk
        budget.reserve(extend, 0 if is_chunked else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), budget.rem_chunk)
        # the hook's rule: fewer tokens than requested and not shrunk is "chunked"
        verdict = Verdict.SHRUNK if shrunk else (Verdict.CHUNKED if is_chunked or extend < requested
                                                 else Verdict.ADMITTED)
        self._emit_admit(req, device_prefix, requested, req.host_hit, extend, verdict, budget, need)
        return "chunked" if is_chunked else budget.state()

    def _unadmit(self, req: RefReq) -> None:
        self.model.release(req.rid, checkpoint=False)
        req.in_model = False

    def _emit_admit(self, req, prefix, requested, host_hit, got, verdict, budget, need, outcome=None) -> None:
        # As the tracer's admission hook on the real code: ``prefix`` is the device prefix before
        # any load-back; a request that keeps waiting for the same outcome (``outcome``: the
        # ``AddReqResult`` name and the budget check's answer; same prefix and request) gets one
        # row, not one per step, whatever the verdict (``no_token`` / ``swa_wait``) of the repeat.
        if got:
            self._last_reject.pop(req.rid, None)
        else:
            key = (outcome, prefix, requested)
            if self._last_reject.get(req.rid) == key:
                return
            self._last_reject[req.rid] = key
        tracer.sched(int(SchedKind.ADMIT), self.trace_ct, 0, 0, 0, 0, req.rid, prefix, requested, host_hit,
                     requested, got, int(verdict), int(budget.rem_total),
                     int(budget.rem_swa) if self.settings.has_swa else -1, need)

    def _evict(self, full_tokens: int, swa_tokens: int) -> None:
        """``evict_for_alloc``: evict the shortfall of ``full_tokens`` / ``swa_tokens`` against
        what is available (nothing to do, and no call into the model, when both fit)."""
        pools = self.model.pools
        if pools.full_available_tokens() >= full_tokens and (
                not swa_tokens or pools.swa_available_tokens() >= swa_tokens):
            return
        self._emit_evict(self.model.make_room(full_tokens, swa_tokens), -1)

    def _emit_evict(self, res, rid: int) -> None:
        if res.full_tokens or res.swa_tokens or res.host_full_tokens:
            tracer.cache(int(CacheOp.EVICT), rid, 0, 0, 0, res.full_tokens, res.swa_tokens, res.host_full_tokens,
                         res.num_deleted_nodes + res.num_demoted_nodes + res.num_tombstoned_nodes,
                         res.num_tombstoned_nodes)

    def _alloc_extend(self, reqs: list[RefReq], extends: dict[int, int]) -> None:
        ps, model = self.settings.page_size, self.model
        items, extend_tokens = [], 0
        for r in reqs:
            st = model.request(r.rid)
            n = r.extend_end - st.seq_tokens
            if n > 0:
                items.append((r.rid, n))
                extend_tokens += n
        # The eviction demand of 0.5.23's ``alloc_for_extend``: the batch's extend tokens, plus one
        # page per request when paged (``alloc_paged_token_slots_extend``'s conservative estimate).
        need = extend_tokens + (len(reqs) * ps if ps > 1 else 0)
        self._evict(need, need if self.settings.has_swa else 0)
        if items and not model.alloc_extend_batch(items):
            raise RuntimeError(f"reference backend: step {self.forward_ct}: extend of {need} tokens does not fit "
                               f"after eviction; occupancy={self._occ_text()}")


__all__ = ["AdmissionMixin"]
