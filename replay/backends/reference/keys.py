"""Token ids and per-page tree keys of the reference backend's requests.

Token ids come from the real backend's :class:`replay.backends.sglang.tokens.TokenSynth` (a pure
numpy module), so both backends see the same prompts and outputs and share exactly the same
prefixes. A page's key is a chained 64-bit hash of every token up to the page's end: each page's
tokens are hashed (position in the page mixed in, splitmix64 per token, summed, mixed again) and
the chain is a polynomial over those page hashes modulo 2^64 (``c_k = c_{k-1} * P + h_k``) with a
final splitmix64, so a run of new pages is hashed with a few numpy operations (no Python call per
page). Equal keys = equal token prefixes (up to a ~2^-63 collision per pair of pages).
"""

from __future__ import annotations

import numpy as np

from replay.memory.radix.match import GrowingKeys

_MASK = (1 << 64) - 1
_P = (0x100000001B3 * 0x9E3779B97F4A7C15 | 1) & _MASK  # an odd multiplier (invertible mod 2^64)
_P_INV = pow(_P, -1, 1 << 64)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_POS = np.uint64(0xC2B2AE3D27D4EB4F)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer over a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _cumpow(base: int, n: int) -> np.ndarray:
    a = np.full(n, base, dtype=np.uint64)
    a[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(a, dtype=np.uint64)


class _Powers:
    """``P^j`` and ``P^-j`` mod 2^64 for j = 0..n-1, grown on demand (shared by every request)."""

    def __init__(self) -> None:
        self.pw = np.ones(1, dtype=np.uint64)
        self.pwi = np.ones(1, dtype=np.uint64)

    def get(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pw) < m:
            n = max(m, 2 * len(self.pw))
            self.pw, self.pwi = _cumpow(_P, n), _cumpow(_P_INV, n)
        return self.pw[:m], self.pwi[:m]


_POWERS = _Powers()


def page_keys(tokens: np.ndarray, page_size: int, prev: int = 0, chains: list | None = None
              ) -> tuple[list[int], int]:
    """Keys of the whole pages of ``tokens`` chained after ``prev``.

    Args:
        tokens: int64 token ids (a multiple of ``page_size`` long).
        page_size: tokens per page.
        prev: the chain value after the previous page (0 at the start of a sequence).
        chains: when given, the chain value after each page is appended to it.
    Returns:
        (keys as non-negative Python ints < 2^63, the chain value after the last page).
    """
    m = len(tokens) // page_size
    if m == 0:
        return [], prev
    with np.errstate(over="ignore"):
        x = np.ascontiguousarray(tokens, dtype=np.int64).view(np.uint64).reshape(m, page_size)
        pos = (np.arange(1, page_size + 1, dtype=np.uint64) * _POS)
        h = _mix64(_mix64(x + pos).sum(axis=1, dtype=np.uint64))
        pw, pwi = _POWERS.get(m)
        s = np.cumsum(h * pwi, dtype=np.uint64) + np.uint64((prev * _P) & _MASK)
        c = pw * s  # c_k = P^k * (P * prev + sum_j h_j P^-j)
        keys = (_mix64(c) >> np.uint64(1)).tolist()
    if chains is not None:
        chains.extend(c.tolist())
    return keys, int(c[-1])


class LazyPrompt:
    """A prompt's token ids synthesized on demand, a slice at a time (``synth.sequence_slice``):
    a request whose leading pages are adopted from its session's previous turn never builds
    them."""

    __slots__ = ("synth", "wreq", "length")

    def __init__(self, synth, wreq, length: int) -> None:
        self.synth, self.wreq, self.length = synth, wreq, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop, _ = sl.indices(self.length)
        return self.synth.sequence_slice(self.wreq, start, stop)


class PageKeys:
    """Chained page keys of one token sequence: the prompt, then the tokens of ``extra`` (a list
    the caller appends to, e.g. the request's output ids); keys are computed once per page,
    lazily.

    Args:
        tokens: the prompt's token ids (an array, or a :class:`LazyPrompt`).
        page_size: tokens per page.
        extra: the tokens after the prompt, appended to by the caller (a new list when None).
    """

    __slots__ = ("prompt", "prompt_len", "extra", "ps", "keys", "chains", "_last")

    def __init__(self, tokens, page_size: int, extra: list[int] | None = None) -> None:
        self.prompt = tokens if isinstance(tokens, LazyPrompt) else np.ascontiguousarray(tokens, dtype=np.int64)
        self.prompt_len = len(self.prompt)
        self.extra = [] if extra is None else extra
        self.ps = page_size
        self.keys: list[int] = GrowingKeys()  # append-only: the tree memoizes its key comparisons
        self.chains: list[int] = []  # the chain value after each keyed page
        self._last = 0  # the chain value after the last keyed page

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.extra)

    def append(self, token: int) -> None:
        self.extra.append(int(token))

    def adopt(self, other: PageKeys, pages: int) -> None:
        """Take the first ``pages`` keys of ``other``, a sequence whose first ``pages * ps``
        tokens are this one's (the caller knows: equal hash blocks give equal tokens), instead of
        hashing them again. Only before any key of this sequence is computed."""
        if self.keys or pages <= 0:
            return
        other.up_to(pages * self.ps)
        pages = min(pages, len(other.keys))
        if pages <= 0:
            return
        self.keys.extend(other.keys[:pages])
        self.chains.extend(other.chains[:pages])
        self._last = self.chains[-1]

    def _tokens(self, start: int, end: int) -> np.ndarray:
        p = self.prompt_len
        if end <= p:
            return self.prompt[start:end]
        tail = np.array(self.extra[max(0, start - p):end - p], dtype=np.int64)
        return tail if start >= p else np.concatenate((self.prompt[start:p], tail))

    def up_to(self, num_tokens: int) -> list[int]:
        """Keys of the full pages within the first ``num_tokens`` tokens (the object's own list
        when that is every key computed so far: callers copy, never mutate)."""
        keys = self.keys
        total = self.prompt_len + len(self.extra)
        n = (num_tokens if num_tokens < total else total) // self.ps
        if n == len(keys):
            return keys
        if len(keys) < n:
            ps = self.ps
            new, self._last = page_keys(self._tokens(len(keys) * ps, n * ps), ps, self._last, self.chains)
            keys.extend(new)
        return keys if n == len(keys) else keys[:n]


__all__ = ["LazyPrompt", "PageKeys", "page_keys"]
