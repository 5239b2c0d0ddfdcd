"""The scheduler code of sglang 0.5.23 that the backend loop mirrors, call for call.

``SchedulerMirror`` holds the parts of ``Scheduler.get_next_batch_to_run``,
``_get_new_batch_prefill_raw``, ``update_running_batch`` and ``process_batch_result_prefill/decode``
that touch memory, reduced to the non-overlap scheduler without PP/DP, speculative decoding,
mixed chunks, LoRA, grammars, sessions or storage. Every call into sglang here is the real one,
in the real order; only the surrounding control flow is restated (the ``Scheduler`` class itself
needs a model runner).

It is a mixin of :class:`replay.backends.sglang.loop.SglangBackend` and uses its state: ``rt``
(the real objects), ``settings``, ``waiting`` (list of ``Req``), ``running`` (``ScheduleBatch``),
``last_batch``, ``chunked_req``, ``result``, ``_last_retracted``, ``_next_token(req)`` and
``_complete(req, reason)``.

Not the default: sglang's own ``Scheduler`` is (``scheduler=real``,
:mod:`replay.backends.sglang.scheduler`). The mirror (``--set scheduler=mirror``) is kept as the
oracle of ``tests/sglang/test_scheduler_agreement.py`` (docs/sglang.md, "Why the mirror stays").
"""

from __future__ import annotations


class SchedulerMirror:
    """Batch selection and result processing of sglang's scheduler (see the module docstring)."""

    def _next_batch(self):
        """Mirror of ``Scheduler.get_next_batch_to_run`` (non-overlap, no PP/DP/spec)."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        self._last_retracted = 0
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.rt.tree)  # stash_chunked_request
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < last_bs:
                self.running.batch_is_full = False
            if not last.is_empty() and last is not self.running:
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        running_bs = self.running.batch_size()
        self.running.filter_batch()
        if self.running.batch_size() < running_bs:
            self.running.batch_is_full = False
        new_batch = self._new_prefill_batch()
        if new_batch is not None:
            return new_batch
        if not self.running.is_empty():
            return self._update_running_batch()
        return None

    def _num_allocatable_reqs(self, running_bs: int, num_held_rows: int = 0) -> int:
        rows = self.rt.req_to_token_pool.available_size() + num_held_rows
        return max(0, min(self.settings.max_running_requests - running_bs, rows))

    def _new_prefill_batch(self):
        """Mirror of ``Scheduler._get_new_batch_prefill_raw`` (no LoRA, grammar, storage, PP)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        rt, s, running = self.rt, self.settings, self.running
        if s.has_swa or running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = running.batch_size()
        if self._num_allocatable_reqs(running_bs) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        rt.policy.calc_priority(self.waiting, running)
        adder = PrefillAdder(
            s.page_size, rt.tree, rt.allocator, running, rt.ratio.current, s.max_prefill_tokens,
            s.chunked_prefill_size, 0, 0, max_prefill_bs=0, max_running_requests=s.max_running_requests,
            waiting_queue_len=len(self.waiting),
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = rt.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting, adder.rem_chunk_tokens or 0, s.page_size)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            num_held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(running.batch_size(), num_held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(rt.tree)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                                    truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        admitted = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = ScheduleBatch.init_new(can_run, rt.req_to_token_pool, rt.allocator, rt.tree, rt.model_config,
                                       False, SpeculativeAlgorithm.NONE, chunked_req=self.chunked_req)
        if rt.tree.cache_controller is not None:
            batch.hicache_consumer_index = rt.tree.ready_to_load_host_cache()
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        return batch

    def _update_running_batch(self):
        """Mirror of ``Scheduler.update_running_batch``: retract when decode memory runs out."""
        batch = self.running
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        initial_bs = batch.batch_size()
        if not batch.check_decode_mem():
            retracted, new_ratio, aborted = batch.retract_decode()
            self.rt.ratio.current = new_ratio
            self._last_retracted = len(retracted)
            self.result.num_retractions += len(retracted)
            for req in aborted:
                self._complete(req, "retract_oom")
            self.waiting.extend(retracted)
        else:
            self.rt.ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return None
        batch.prepare_for_decode()
        return batch

    # ---------------------------------------------------------------- results
    def _process_prefill(self, batch) -> None:
        """Mirror of ``process_batch_result_prefill`` for the memory-relevant calls."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tree = self.rt.tree
        for req in batch.reqs:
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1  # a middle chunk: no output yet
                continue
            req.output_ids.append(self._next_token(req))
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, tree, checkpoint=True)
                self._complete(req, "finished")
            else:
                checkpoint_kv_cache(req, tree)

    def _process_decode(self, batch) -> None:
        """Mirror of ``process_batch_result_decode`` for the memory-relevant calls."""
        from sglang.srt.mem_cache.common import release_kv_cache

        allocator, tree = self.rt.allocator, self.rt.tree
        allocator.free_group_begin()
        try:
            for req in batch.reqs:
                req.output_ids.append(self._next_token(req))
                req.update_finish_state(1)
                if req.finished():
                    release_kv_cache(req, tree, checkpoint=True)
                    self._complete(req, "finished")
        finally:
            allocator.free_group_end()
