"""Block content keys of synthetic and imported prompts; their page hashes come from the one
page-hash function, ``tracer.schema.hashing`` (``kvtrace-chain-v1``).

A prompt is cut into hash blocks of ``hash_block_tokens`` tokens; only full blocks are hashed.
Each block has a 64-bit *content key*: an imported block id (Mooncake/Bailian ``hash_ids``), or a
key the generator derives from synthetic segments (:func:`segment_block_keys`). The page hash of
block j chains the previous page hash with key j (:func:`chain_hashes`), so two prompts share
hash j exactly when their first j+1 block keys are equal (up to 64-bit collisions). Everything is
uint64 numpy arithmetic, never Python's salted ``hash()``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tracer.schema.hashing import chain, fmix64

U64 = np.uint64
_OFF_MUL = U64(0xD6E8FEB86659FD93)
_LEN_MUL = U64(0xA0761D6478BD642F)
_PIECE_ROOT = U64(0x243F6A8885A308D3)


def rotl(x: np.ndarray, r: int) -> np.ndarray:
    """Rotate a uint64 array left by ``r`` bits."""
    return (x << U64(r)) | (x >> U64(64 - r))


def name_key(*parts: object) -> int:
    """A 64-bit key for a named piece of synthetic content (blake2b of the joined parts).

    Args:
        parts: anything with a stable ``str`` (shape name, prompt index, unit serial, ...).

    Returns:
        An int in [0, 2**64).
    """
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def chain_hashes(keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Chained page hashes of many prompts at once (``tracer.schema.hashing.chain``).

    Args:
        keys: uint64 content keys of all prompts, concatenated (prompt i owns
            ``keys[offsets[i]:offsets[i] + lengths[i]]``).
        lengths: number of full blocks of each prompt.

    Returns:
        uint64 array, same shape as ``keys``: the chained hash of every block.
    """
    return chain(keys, lengths)


def chain_one(keys) -> np.ndarray:
    """Chained hashes of a single prompt's block keys (convenience for tests and small inputs)."""
    return chain(keys)


def segment_block_keys(seg_keys, seg_tokens, block_tokens: int) -> np.ndarray:
    """Content keys of the full blocks of a prompt made of synthetic segments.

    A segment is a run of ``seg_tokens[i]`` tokens whose content is identified by
    ``seg_keys[i]``. A block's key folds the (segment key, offset in segment, length) pieces that
    make it up, in order, so two prompts get equal block keys exactly where their token content
    is equal at the same position.

    Args:
        seg_keys: uint64-compatible keys, one per segment, in prompt order.
        seg_tokens: tokens per segment.
        block_tokens: tokens per hash block.

    Returns:
        uint64 array with ``sum(seg_tokens) // block_tokens`` keys.
    """
    seg_keys = np.asarray(seg_keys, dtype=U64)
    seg_tokens = np.asarray(seg_tokens, dtype=np.int64)
    keep = seg_tokens > 0
    seg_keys, seg_tokens = seg_keys[keep], seg_tokens[keep]
    nblocks = int(seg_tokens.sum()) // block_tokens
    if nblocks == 0:
        return np.empty(0, dtype=U64)
    end = nblocks * block_tokens
    seg_starts = np.zeros(len(seg_tokens), dtype=np.int64)
    np.cumsum(seg_tokens[:-1], out=seg_starts[1:])
    # Pieces: the block grid cut again at every segment start inside the hashed span.
    cuts = np.union1d(np.arange(0, end, block_tokens), seg_starts[seg_starts < end])
    lengths = np.diff(np.append(cuts, end))
    block = cuts // block_tokens
    seg = np.searchsorted(seg_starts, cuts, side="right") - 1
    offset = cuts - seg_starts[seg]
    # rank of each piece within its block (pieces of a block are consecutive)
    first = np.searchsorted(block, block, side="left")
    rank = np.arange(len(cuts)) - first
    keys = np.full(nblocks, _PIECE_ROOT, dtype=U64)
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        b = block[sel]
        keys[b] = _piece_fold(keys[b], seg_keys[seg[sel]], offset[sel].astype(U64), lengths[sel].astype(U64))
    return keys


def _piece_fold(acc, seg_key, offset, length) -> np.ndarray:
    piece = fmix64(seg_key ^ (offset * _OFF_MUL + length * _LEN_MUL))
    return fmix64(rotl(acc, 29) ^ piece)
