"""One request of the reference scheduler: its workload row, tokens and scheduling state."""

from __future__ import annotations

from replay.backends.reference.keys import PageKeys

EOS_TOKEN_ID = 0


def output_plan(wreq) -> list[int]:
    """The outputs a request will generate, as far as the scheduler reads them: ``output_len``
    tokens, the last :data:`EOS_TOKEN_ID` when it stops before ``max_new_tokens`` (as
    ``TokenSynth.output_ids``, whose other ids are never EOS); the others stand in for the ids,
    which only the page keys need (from :class:`replay.backends.reference.keys.SequenceOrigins`)."""
    n = int(wreq.output_len)
    if n <= 0:
        return []
    return [1] * (n - 1) + [EOS_TOKEN_ID if n < wreq.max_new_tokens else 1]


class RefReq:
    """One request: its workload row, tokens, and scheduling state (sglang ``Req``'s fields)."""

    __slots__ = ("wreq", "rid", "input_len", "max_new_tokens", "plan", "output_ids", "keys", "prefix_len",
                 "extend_end", "in_model", "cached_tokens", "host_hit", "swa_host_hit", "inflight_chunks",
                 "retracted", "first_prefix", "decode_batch_idx", "finish_index", "_whole")

    def __init__(self, wreq, prompt, plan: list[int], ps: int, max_new_tokens: int, origins=None) -> None:
        self.wreq = wreq
        self.rid = int(wreq.rid)
        self.input_len = int(wreq.input_len)
        self.max_new_tokens = max_new_tokens
        self.plan = plan
        self.output_ids: list[int] = []
        # keys read the output ids as they grow (with ``origins``, only how many: ``PageKeys``)
        self.keys = PageKeys(prompt, ps, self.output_ids, origins)
        self.prefix_len = 0
        self.extend_end = 0
        self.in_model = False
        self.cached_tokens = 0
        self.host_hit = self.swa_host_hit = 0
        self.inflight_chunks = 0
        self.retracted = False
        self.first_prefix = -1
        self.decode_batch_idx = 0  # decode steps since (re)admission (sglang ``Req.decode_batch_idx``)
        # the output index whose append finishes the request (its token is EOS, it runs past the
        # plan, or it reaches ``max_new_tokens``): what ``finished()`` answers, known in advance
        stop = max(0, min(len(plan), max_new_tokens - 1))
        try:
            stop = plan.index(EOS_TOKEN_ID, 0, stop)
        except ValueError:
            pass
        self.finish_index = stop
        self._whole: tuple | None = None  # (fill_len, its keys): ``whole_keys``

    @property
    def fill_len(self) -> int:
        """Tokens to prefill: the prompt plus what it generated before a retraction."""
        return self.input_len + len(self.output_ids)

    def whole_keys(self) -> list[int]:
        """``keys.up_to(fill_len)``: the keys of the sequence to prefill, kept while its length
        stays (a waiting request is matched at every admission and walked by every prefix
        refresh; its keys list never grows past ``fill_len``, so the same list is the answer)."""
        n = self.input_len + len(self.output_ids)
        whole = self._whole
        if whole is not None and whole[0] == n:
            return whole[1]
        keys = self.keys.up_to(n)
        self._whole = (n, keys)
        return keys

    def finished(self) -> bool:
        return bool(self.output_ids) and (self.output_ids[-1] == EOS_TOKEN_ID
                                          or len(self.output_ids) >= self.max_new_tokens)


__all__ = ["EOS_TOKEN_ID", "RefReq", "output_plan"]
