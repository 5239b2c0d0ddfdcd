"""Prefill admission budgets of sglang 0.5.23's ``PrefillAdder`` (DESIGN.md §4.4), restated.

Per step: remaining total tokens (full available + full evictable minus the decode reservation of
running requests, ``new_token_ratio`` of each one's remaining output, and what this step admitted),
remaining chunk tokens (``chunked_prefill_size``), remaining input tokens
(``max_prefill_tokens``) and, for SWA models, remaining SWA tokens (SWA available + evictable
minus each admitted extend's SWA need). The SWA need of an extend is
``max(extend - W, 0) + min(extend + max_new, W) + ps + host-hit window``
(:func:`swa_need_tokens`). ``swa_admission`` decides what an extend whose SWA need does not fit
does: wait (``all_or_nothing``), or shrink its chunk to what leaves the decode window, a page of
slack and the host-hit window (``shrink_always``; ``shrink_never_fits`` only when the need is at
least the whole SWA pool).
"""

from __future__ import annotations

#: sglang ``CLIP_MAX_NEW_TOKENS`` (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, default 4096)
CLIP_MAX_NEW_TOKENS = 4096


def ceil_page(tokens: int, ps: int) -> int:
    return -(-tokens // ps) * ps


def swa_need_tokens(extend: int, max_new: int, window: int, ps: int, chunk_limit: int | None = None,
                    host_hit: int = 0, *, dsv4: bool = False) -> int:
    """Peak SWA tokens of one extend (sglang ``estimate_swa_kv_tokens``; ``dsv4``: the fork's
    ``_swa_budget_for_req``, which reserves the whole window whatever the output length)."""
    allocated = extend if chunk_limit is None else min(extend, chunk_limit)
    need = max(allocated - window, 0) + (window if dsv4 else min(extend + max_new, window)) + ps
    if host_hit > 0:
        need += ceil_page(host_hit, ps)
    return need


class NewTokenRatio:
    """sglang's ``NewTokenRatioTracker`` with its default environment (0.7, factor 0.14, 600 steps,
    20 retract-decode steps)."""

    INIT, MIN_FACTOR, DECAY_STEPS, RETRACT_DECODE_STEPS = 0.7, 0.14, 600, 20

    def __init__(self) -> None:
        self.init = min(self.INIT, 1.0)
        self.min = min(self.init * self.MIN_FACTOR, 1.0)
        self.decay = (self.init - self.min) / self.DECAY_STEPS
        self.current = self.init

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def reset(self) -> None:
        self.current = self.init

    @classmethod
    def after_retract(cls, reqs) -> float:
        """Estimate from the requests left running (``estimate_new_token_ratio_after_retract``)."""
        decoded = sum(len(r.output_ids) for r in reqs)
        max_new = sum(r.max_new_tokens for r in reqs)
        return min(1.0, (decoded + cls.RETRACT_DECODE_STEPS * len(reqs)) / (max_new + 1))


class PrefillBudget:
    """One step's admission budgets (see the module docstring).

    Args:
        model: the :class:`replay.memory.KVCacheModel` (live availability and evictable sizes).
        settings: the run's settings.
        running: requests decoding now (their reservation is ``new_token_ratio`` of the rest).
        ratio: the current ``new_token_ratio``.
    """

    def __init__(self, model, settings, running, ratio: float) -> None:
        self.model = model
        self.s = settings
        self.ps = settings.page_size
        self.window = settings.sliding_window_tokens
        self.rem_chunk = settings.chunked_prefill_size
        self.rem_input = settings.max_prefill_tokens
        # min(outputs to come, CLIP) * ratio, term by term (a conditional: the builtin's call
        # costs more than the term)
        self.total_offset = sum([(d if (d := r.max_new_tokens - len(r.output_ids)) < CLIP_MAX_NEW_TOKENS
                                  else CLIP_MAX_NEW_TOKENS) * ratio for r in running])
        self.current_offset = 0
        self.swa_offset = 0
        # tokens a pending tree lock would move evictable -> protected (``check_prefill`` of a
        # request not yet locked reads the ledgers as the lock would leave them; ints, exact)
        self.lock_full = 0
        self.lock_swa = 0

    @classmethod
    def with_offset(cls, model, settings, total_offset: float) -> PrefillBudget:
        """A budget whose running requests' reservation is given (``total_offset``, the same sum
        ``__init__`` takes over the running requests, computed by the caller in the same order)."""
        self = cls.__new__(cls)
        self.model, self.s, self.ps = model, settings, settings.page_size
        self.window = settings.sliding_window_tokens
        self.rem_chunk = settings.chunked_prefill_size
        self.rem_input = settings.max_prefill_tokens
        self.total_offset = total_offset
        self.current_offset = self.swa_offset = self.lock_full = self.lock_swa = 0
        return self

    # ---- live capacity
    def _full_room(self) -> int:
        return self.model.pools.full_available_tokens() + (self.model.cache.full_ledger()[0] - self.lock_full)

    @property
    def rem_total(self) -> float:
        return self._full_room() - self.total_offset

    @property
    def rem_current(self) -> float:
        return self._full_room() - self.current_offset

    @property
    def rem_swa(self) -> float:
        if not self.s.has_swa:
            return 0
        return (self.model.pools.swa_available_tokens() + (self.model.cache.swa_ledger()[0] - self.lock_swa)
                - self.swa_offset)

    def has_capacity(self) -> bool:
        room = self._full_room()  # ``rem_total`` and ``rem_current`` on one reading
        if not (room - self.total_offset > 0 and room - self.current_offset > 0):
            return False
        return self.rem_swa > 0 if self.s.has_swa else True

    def state(self) -> str:
        """``continue``, ``no_token`` or ``other`` (sglang ``budget_state``)."""
        if not self.has_capacity():
            return "no_token"
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return "other"
        return "continue"

    # ---- checks
    def swa_need(self, extend: int, max_new: int, chunk_limit: int | None = None, host_hit: int = 0) -> int:
        return swa_need_tokens(extend, max_new, self.window, self.ps, chunk_limit, host_hit,
                               dsv4=self.s.kv_stack == "dsv4")

    def check_prefill(self, extend: int, total_tokens: int, max_new: int, swa_host_hit: int,
                      chunk_limit: int | None, total_fits: bool = False) -> tuple[bool, int | None, int]:
        """(admit, chunk limit, SWA need) of an extend (sglang ``check_prefill``); ``total_fits``:
        the SWA part alone, as if the total fitted."""
        if not self.s.has_swa:
            fits = total_fits or total_tokens < self.rem_total
            return fits, (chunk_limit if fits else None), -1
        extend = ceil_page(extend, self.ps)
        need = self.swa_need(extend, max_new, chunk_limit, swa_host_hit)
        if not total_fits and total_tokens >= self.rem_total:
            return False, None, need  # the need is still reported, as the tracer's hook does
        rem_swa = self.rem_swa
        if need < rem_swa:
            return True, chunk_limit, need
        mode = self.s.swa_admission
        shrink = mode == "shrink_always" or (mode == "shrink_never_fits" and need >= self.s.swa_tokens)
        cap = 0
        if shrink:
            headroom = self.swa_need(0, max_new, None, swa_host_hit)
            cap = max(0, int(rem_swa) - headroom) // self.ps * self.ps
        if chunk_limit is None or cap <= 0:
            return False, None, need
        return True, min(chunk_limit, cap), need

    def available_chunk_tokens(self) -> int | None:
        """Tokens a chunked request's next chunk may take (None: none this step)."""
        avail = min(self.rem_chunk, int(self.rem_total))
        if self.s.has_swa:
            avail = min(avail, int(self.rem_swa) - self.ps)
        if avail > 0:
            return avail
        return None if self.s.has_swa else self.rem_chunk

    def reserve(self, extend: int, max_new: int, chunk_limit: int | None) -> None:
        """Charge one admitted extend (sglang ``_update_prefill_budget`` + ``reserve``)."""
        extend = ceil_page(extend, self.ps)
        immediate = extend + self.ps
        self.total_offset += immediate + max_new
        self.current_offset += immediate
        if self.s.has_swa:
            self.swa_offset += self.swa_need(extend, max_new, chunk_limit)
        self.rem_input -= extend
        self.rem_chunk -= extend


__all__ = ["CLIP_MAX_NEW_TOKENS", "NewTokenRatio", "PrefillBudget", "ceil_page", "swa_need_tokens"]
