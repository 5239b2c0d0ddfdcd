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

    Args:
        tokens: the initial token ids.
        page_size: tokens per page.
    """

    __slots__ = ("tokens", "ps", "keys")

    def __init__(self, tokens, page_size: int) -> None:
        self.tokens = [int(t) for t in np.asarray(tokens, dtype=np.int64)]
        self.ps = page_size
        self.keys: list[int] = []

    def append(self, token: int) -> None:
        self.tokens.append(int(token))

    def up_to(self, num_tokens: int) -> list[int]:
        """Keys of the full pages within the first ``num_tokens`` tokens."""
        n = min(num_tokens, len(self.tokens)) // self.ps
        keys, ps = self.keys, self.ps
        while len(keys) < n:
            i = len(keys)
            prev = keys[-1] if keys else 0
            page = np.asarray(self.tokens[i * ps:(i + 1) * ps], dtype=np.int64).tobytes()
            digest = hashlib.blake2b(prev.to_bytes(8, "little") + page, digest_size=8).digest()
            keys.append(int.from_bytes(digest, "little") >> 1)
        return keys[:n]


__all__ = ["PageKeys"]
