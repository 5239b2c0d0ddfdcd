"""Decode of the reference scheduler: sglang 0.5.23's ``update_running_batch`` (decode-memory
check, ``retract_decode`` with ``release_req``'s eviction demand, the new-token-ratio estimate)
and ``prepare_for_decode`` (``maybe_evict_swa``'s out-of-window release, ``alloc_for_decode``'s
eviction demand) restated.

A mixin of :class:`replay.backends.reference.scheduler.ReferenceBackend`.
"""

from __future__ import annotations

import tracer
from replay.backends.reference.budget import NewTokenRatio
from replay.backends.reference.request import RefReq
from tracer.schema import CacheOp, SchedKind


class DecodeMixin:
    """Running-batch update and decode preparation (see the module docstring)."""

    def _update_running_batch(self):
        batch = self.running
        if not batch:
            self.batch_is_full = False
            return None
        initial = len(batch)
        if not self._check_decode_mem(batch):
            retracted, aborted = self._retract(batch)
            self.ratio.current = NewTokenRatio.after_retract(self.running)
            self._last_retracted = len(retracted)
            self.result.num_retractions += len(retracted)
            for r in aborted:
                self._release(r, checkpoint=False)
                self._complete(r, "retract_oom")
            self.waiting.extend(retracted)
        else:
            self.ratio.decay_step()
        batch = self.running
        if len(batch) < initial:
            self.batch_is_full = False
        if not batch:
            return None
        self._prepare_decode(batch)
        return list(batch)

    def _decode_need(self, reqs) -> int:
        ps = self.settings.page_size
        states = self.model.requests.reqs  # read-only lookups, without the checked getter's call
        return sum(1 for r in reqs if states[r.rid].seq_tokens % ps == 0) * ps

    def _check_decode_mem(self, reqs) -> bool:
        need = self._decode_need(reqs)
        self._evict(need, need if self.settings.has_swa else 0)
        return self.model.pools.available_tokens() >= need

    def _retract(self, batch: list[RefReq]):
        order = sorted(range(len(batch)), key=lambda i: (len(batch[i].output_ids), -batch[i].input_len),
                       reverse=True)
        keep = list(order)
        retracted, aborted = [], []
        first = True
        while first or not self._check_decode_mem([batch[i] for i in keep]):
            if len(keep) == 1:
                break
            first = False
            req = batch[keep.pop()]
            self._emit_retract(req)
            self._release(req, checkpoint=False)
            # ``release_req``: use the freed memory at once, evicting for the requests still kept
            # (``remaining * SGLANG_RETRACT_DECODE_STEPS`` tokens, both pools).
            need = len(keep) * NewTokenRatio.RETRACT_DECODE_STEPS
            self._evict(need, need if self.settings.has_swa else 0)
            req.retracted = True
            req.prefix_len = req.extend_end = req.decode_batch_idx = 0
            retracted.append(req)
        if len(keep) <= 1 and not self._check_decode_mem([batch[i] for i in keep]):
            # the last request is aborted through the same ``release_req`` (a retract row)
            req = batch[keep.pop()]
            self._emit_retract(req)
            aborted.append(req)
        kept = set(keep)
        self.running = [r for i, r in enumerate(batch) if i in kept]
        return retracted, aborted

    def _release_out_of_window_dsv4(self, batch: list[RefReq]) -> None:
        """The fork's ``maybe_evict_swa`` (DeepSeek-V4 stack): a request's out-of-window SWA is
        released at its decodes ``1, 1 + k, 1 + 2k, ...`` with ``k = max(ps, interval)`` cut to
        whole pages (the fork's ``max(ps, W * SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER)``: 256 for
        DSV4's window 128), not when the window has moved ``interval`` tokens past the last
        release as 0.5.23's ``_swa_eviction_trigger``."""
        s, model = self.settings, self.model
        ps = s.page_size
        every = max(ps, s.swa_eviction_interval_tokens) // ps * ps
        get = model.requests.reqs.__getitem__
        for r in batch:
            if r.decode_batch_idx % every != 1:
                continue
            freed = model.free_swa_out_of_window(r.rid, get(r.rid).seq_tokens, 1)
            if freed:
                tracer.cache(int(CacheOp.SWA_RELEASE), r.rid, 0, 0, 0, 0, freed)

    def _emit_retract(self, req: RefReq) -> None:
        tracer.sched(int(SchedKind.RETRACT), self.trace_ct, 0, 0, 0, 0, req.rid, req.prefix_len,
                     max(0, self.model.request(req.rid).seq_tokens - req.prefix_len))

    def _prepare_decode(self, batch: list[RefReq]) -> None:
        s, model = self.settings, self.model
        if s.has_swa and s.swa_out_of_window_release != "off" and s.kv_stack == "dsv4":
            self._release_out_of_window_dsv4(batch)
        elif s.has_swa and s.swa_out_of_window_release != "off":
            get = model.requests.reqs.__getitem__
            window, interval = s.sliding_window_tokens, s.swa_eviction_interval_tokens
            for r in batch:
                if r.decode_batch_idx < 1:
                    continue  # ``maybe_evict_swa`` skips a request's first decode after its prefill
                st = get(r.rid)
                if st.seq_tokens - window < st.swa_evicted_tokens + interval:
                    continue  # release_out_of_window's own early exit, without the call chain
                freed = model.free_swa_out_of_window(r.rid, st.seq_tokens, interval)
                if freed:
                    tracer.cache(int(CacheOp.SWA_RELEASE), r.rid, 0, 0, 0, 0, freed)
        # ``alloc_for_decode``'s eviction demand: one page per request (``bs * page_size``), not
        # only the requests at a page boundary that the decode-memory check counted.
        need = len(batch) * s.page_size
        self._evict(need, need if s.has_swa else 0)
        if not model.alloc_decode([r.rid for r in batch]):
            raise RuntimeError(f"reference backend: step {self.forward_ct}: decode allocation failed after "
                               f"the decode-memory check; occupancy={self._occ_text()}")
        for r in batch:
            r.decode_batch_idx += 1


__all__ = ["DecodeMixin"]
