"""Token ids and per-page tree keys of the reference backend's requests.

Token ids come from the real backend's :class:`replay.backends.sglang.tokens.TokenSynth` (a pure
numpy module), so both backends see the same prompts and outputs and share exactly the same
prefixes. A page's key is a chained 64-bit digest of the page's tokens keyed with the previous
page's digest (one keyed blake2b call per page, no concatenation): equal keys = equal token
prefixes (up to a 2^-64 collision).
"""

from __future__ import annotations

import hashlib

import numpy as np


class PageKeys:
    """Chained page keys of one token sequence, grown as tokens are appended.

    The tokens live in one ``bytearray`` of little-endian int64 (a page's bytes are a slice, no
    per-token Python ints), and keys are computed once per page, lazily.

    Args:
        tokens: the initial token ids.
        page_size: tokens per page.
    """

    __slots__ = ("buf", "ps", "keys", "_last")

    def __init__(self, tokens, page_size: int) -> None:
        self.buf = bytearray(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
        self.ps = page_size
        self.keys: list[int] = []
        self._last = b""  # the last page's digest (the next page's blake2b key)

    @property
    def num_tokens(self) -> int:
        return len(self.buf) >> 3

    def append(self, token: int) -> None:
        self.buf += int(token).to_bytes(8, "little", signed=True)

    def up_to(self, num_tokens: int) -> list[int]:
        """Keys of the full pages within the first ``num_tokens`` tokens (the object's own list
        when that is every key computed so far: callers copy, never mutate)."""
        n = min(num_tokens, len(self.buf) >> 3) // self.ps
        keys = self.keys
        if len(keys) < n:
            step = self.ps * 8
            buf, blake, append = memoryview(self.buf), hashlib.blake2b, keys.append
            prev = self._last
            for i in range(len(keys), n):
                prev = blake(buf[i * step:(i + 1) * step], digest_size=8, key=prev).digest()
                append(int.from_bytes(prev, "little") >> 1)
            self._last = prev
            buf.release()
        return keys if n == len(keys) else keys[:n]


__all__ = ["PageKeys"]
