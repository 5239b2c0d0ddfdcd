"""Token ids and per-page tree keys of the reference backend's requests.

Token ids come from the real backend's :class:`replay.backends.sglang.tokens.TokenSynth` (a pure
numpy module), so both backends see the same prompts and outputs and share exactly the same
prefixes. A page's key is a chained 64-bit digest of the page's tokens and the previous key:
equal keys = equal token prefixes (up to a 2^-64 collision).
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

    __slots__ = ("buf", "ps", "keys")

    def __init__(self, tokens, page_size: int) -> None:
        self.buf = bytearray(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
        self.ps = page_size
        self.keys: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.buf) >> 3

    def append(self, token: int) -> None:
        self.buf += int(token).to_bytes(8, "little", signed=True)

    def up_to(self, num_tokens: int) -> list[int]:
        """Keys of the full pages within the first ``num_tokens`` tokens."""
        n = min(num_tokens, len(self.buf) >> 3) // self.ps
        keys = self.keys
        if len(keys) < n:
            step = self.ps * 8
            buf, blake = memoryview(self.buf), hashlib.blake2b
            prev = keys[-1] if keys else 0
            for i in range(len(keys), n):
                digest = blake(prev.to_bytes(8, "little") + buf[i * step:(i + 1) * step], digest_size=8).digest()
                prev = int.from_bytes(digest, "little") >> 1
                keys.append(prev)
            buf.release()
        return keys[:n]


__all__ = ["PageKeys"]
