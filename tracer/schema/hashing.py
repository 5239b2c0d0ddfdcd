"""The one page-hash function of kvtrace (``kvtrace-chain-v1``): chained 64-bit block hashes.

A prompt is cut into hash blocks of ``hash_block_tokens`` tokens; only full blocks are hashed.
Each block has a 64-bit *content key*; the page hash of block j chains the previous page hash
with that key. Two entry points feed the same core:

- :func:`page_hashes_from_keys`: block keys given directly (workload generators, importers of
  Mooncake/Bailian ``hash_ids``);
- :func:`page_hashes_from_tokens`: token ids (the sglang hooks), whose block key is
  :func:`block_keys_from_tokens` (``sum_k tokens[j*B + k] * R[k] mod 2^64``, fixed odd R[k]).

The core (:func:`chain`) is, in uint64 wrap-around arithmetic::

    m[j] = fmix64(key[j] + KEY_SALT)          # mixed block key
    s[-1] = ROOT;  s[j] = s[j-1] * P + m[j]   # chain state (P odd)
    h[j] = fmix64(s[j])                       # page hash

``fmix64`` (MurmurHash3's finalizer) and ``x -> x * P`` are bijections of 2^64, so h[j] is a
function of (h[j-1], key[j]) exactly: h[j] = fmix64(fmix64^-1(h[j-1]) * P + m[j]). Two prompts
share h[j] exactly when their first j+1 block keys are equal (up to 64-bit collisions). Because
s[j] = P^j * (ROOT * P + sum_{i<=j} m[i] * P^-i), the chain is computed without a Python loop per
block (one cumulative sum), which keeps the hook's cost per arrival at tens of microseconds.

Readers find the function's name in the manifest key ``page_hash``; a trace without that key
was written before it existed (:data:`LEGACY_PAGE_HASH`): its hashes are consistent within the
trace (prefix matching works) but not comparable with ``kvtrace-chain-v1`` hashes.

numpy and the standard library only (runs inside the server).
"""

from __future__ import annotations

import numpy as np

PAGE_HASH_NAME = "kvtrace-chain-v1"
LEGACY_PAGE_HASH = "kvtrace-legacy"  # default for traces whose manifest has no ``page_hash``

U64 = np.uint64
ROOT = U64(0x6B76747261636521)  # b"kvtrace!"
KEY_SALT = U64(0x9E3779B97F4A7C15)
P = U64(0x100000001B3 * 2 + 1)  # odd: invertible mod 2^64
P_INV = U64(pow(int(P), -1, 1 << 64))
_M1 = U64(0xFF51AFD7ED558CCD)
_M2 = U64(0xC4CEB9FE1A85EC53)
_TOKEN_MUL = U64(0xD6E8FEB86659FD93)

_pows: dict[str, np.ndarray] = {"p": np.ones(1, U64), "q": np.ones(1, U64)}
_token_mults: dict[int, np.ndarray] = {}


def page_hash_of(manifest: dict) -> str:
    """Name of the page-hash function a trace used (``LEGACY_PAGE_HASH`` when not recorded)."""
    return str(manifest.get("page_hash") or LEGACY_PAGE_HASH)


def fmix64(x) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer on a uint64 array (returns a new array)."""
    return _fmix_inplace(np.array(x, dtype=U64, copy=True))


def _fmix_inplace(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x ^= x >> U64(33)
        x *= _M1
        x ^= x >> U64(33)
        x *= _M2
        x ^= x >> U64(33)
    return x


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^j and P^-j (mod 2^64) for j < n (cached, grown geometrically)."""
    if len(_pows["p"]) < n:
        m = max(n, 2 * len(_pows["p"]), 64)
        with np.errstate(over="ignore"):
            _pows["p"] = np.cumprod(np.concatenate([[U64(1)], np.full(m - 1, P, U64)]), dtype=U64)
            _pows["q"] = np.cumprod(np.concatenate([[U64(1)], np.full(m - 1, P_INV, U64)]), dtype=U64)
    return _pows["p"][:n], _pows["q"][:n]


def chain(keys, lengths=None) -> np.ndarray:
    """The core: chained page hashes of one or many prompts' block keys.

    Args:
        keys: uint64 block content keys of all prompts, concatenated (prompt i owns
            ``keys[offsets[i]:offsets[i] + lengths[i]]``).
        lengths: full blocks of each prompt; None: ``keys`` is one prompt.

    Returns:
        uint64 array, same shape as ``keys``: the page hash of every block.
    """
    keys = np.asarray(keys, dtype=U64).reshape(-1)
    n = len(keys)
    if n == 0:
        return np.zeros(0, U64)
    with np.errstate(over="ignore"):
        mixed = _fmix_inplace(keys + KEY_SALT)
        if lengths is None:
            p, q = _powers(n)
            state = np.cumsum(mixed * q, dtype=U64)
            state += ROOT * P
            state *= p
            return _fmix_inplace(state)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != n or (lengths < 0).any():
            raise ValueError(f"lengths sum to {int(lengths.sum())}, expected {n} (one per key)")
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        pos = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)  # position in its prompt
        p, q = _powers(int(lengths.max()))
        total = np.cumsum(mixed * q[pos], dtype=U64)
        before = np.concatenate([[U64(0)], total])[np.repeat(starts, lengths)]  # sum before prompt
        state = (total - before + ROOT * P) * p[pos]
        return _fmix_inplace(state)


def page_hashes_from_keys(keys, lengths=None) -> np.ndarray:
    """Entry point for block keys (generators, importers): same as :func:`chain`."""
    return chain(keys, lengths)


def _token_multipliers(block_tokens: int) -> np.ndarray:
    r = _token_mults.get(block_tokens)
    if r is None:
        with np.errstate(over="ignore"):
            seed = np.arange(1, block_tokens + 1, dtype=U64) * _TOKEN_MUL
        r = _token_mults[block_tokens] = fmix64(seed) | U64(1)
    return r


def _as_int64(token_ids) -> np.ndarray:
    if type(token_ids) is list:  # sglang's origin_input_ids: fromiter is ~25 % faster
        return np.fromiter(token_ids, np.int64, len(token_ids))
    if getattr(token_ids, "typecode", None) == "q":  # array('q') and subclasses
        return np.frombuffer(token_ids, dtype=np.int64)
    return np.asarray(token_ids, dtype=np.int64).reshape(-1)


def block_keys_from_tokens(token_ids, block_tokens: int) -> np.ndarray:
    """Content keys of the full blocks of a token sequence.

    Args:
        token_ids: ``array('q')``, list of ints or any int sequence numpy accepts.
        block_tokens: tokens per hash block (> 0).

    Returns:
        uint64 array, one key per full block (a partial last block has none).
    """
    toks = _as_int64(token_ids)
    n = len(toks) // block_tokens
    if n == 0:
        return np.zeros(0, U64)
    blocks = toks[: n * block_tokens].reshape(n, block_tokens).view(U64)
    with np.errstate(over="ignore"):
        return (blocks * _token_multipliers(block_tokens)).sum(axis=1, dtype=U64)


def page_hashes_from_tokens(token_ids, block_tokens: int) -> np.ndarray:
    """Entry point for token ids (the hooks): ``chain(block_keys_from_tokens(...))``."""
    return chain(block_keys_from_tokens(token_ids, block_tokens))
