"""``request`` rows from real sglang ``Req`` objects: arrival (``Req.__init__``) and finish/abort
(``release_kv_cache`` of a finished request).

Token ids are never stored: the prompt is kept as chained page hashes, one per *full* block of
``hash_block_tokens`` tokens (manifest key; ``KVTRACE_HASH_BLOCK_TOKENS``, default 16; 0 turns
hashing off). The chain is the one workloads use (``replay.workloads.hashing``)::

    key[j] = blake2b(block j's token ids as int64 little-endian, 8 bytes) as uint64
    h[-1]  = ROOT;  h[j] = fmix64(rotl(h[j-1], 27) ^ fmix64(key[j] + KEY_SALT))

so equal prompt prefixes, and only those, share hashes (a test checks both implementations
agree). Pure Python integer arithmetic: about 1-2 us per block.
"""

from __future__ import annotations

import hashlib
import os
from array import array

import tracer
from tracer.schema import RequestEvent
from tracer.sglang import state

_NOOP = state._NOOP
ARRIVAL, FINISH, ABORT = int(RequestEvent.ARRIVAL), int(RequestEvent.FINISH), int(RequestEvent.ABORT)
DEFAULT_HASH_BLOCK_TOKENS = 16

_MASK = (1 << 64) - 1
ROOT = 0x6B76747261636521  # b"kvtrace!" (same constants as replay.workloads.hashing)
KEY_SALT = 0x9E3779B97F4A7C15
_M1, _M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def fmix64(x: int) -> int:
    """MurmurHash3's 64-bit finalizer on a Python int."""
    x ^= x >> 33
    x = (x * _M1) & _MASK
    x ^= x >> 33
    x = (x * _M2) & _MASK
    return x ^ (x >> 33)


def chain(keys) -> list[int]:
    """Chained hashes of a sequence of uint64 block keys (``replay.workloads.hashing`` rule)."""
    out, h = [], ROOT
    for k in keys:
        r = ((h << 27) | (h >> 37)) & _MASK
        h = fmix64(r ^ fmix64((int(k) + KEY_SALT) & _MASK))
        out.append(h)
    return out


def hash_block_tokens() -> int:
    """Block size in force: the trace manifest's, else ``KVTRACE_HASH_BLOCK_TOKENS``, else 16."""
    rec = tracer._active
    if rec is not None:
        v = rec.manifest.get("hash_block_tokens")
        if v is not None:
            return int(v)
    return int(os.environ.get("KVTRACE_HASH_BLOCK_TOKENS", DEFAULT_HASH_BLOCK_TOKENS))


def block_keys(token_ids, block_tokens: int) -> list[int]:
    """Content key of every full block of ``token_ids``."""
    if not (isinstance(token_ids, array) and token_ids.typecode == "q"):
        token_ids = array("q", token_ids)
    raw = memoryview(token_ids).cast("B")
    step = block_tokens * 8
    full = (len(raw) // step) * step
    blake = hashlib.blake2b
    return [int.from_bytes(blake(raw[off: off + step], digest_size=8).digest(), "little")
            for off in range(0, full, step)]


def page_hashes(token_ids, block_tokens: int) -> list[int] | None:
    """Chained uint64 hashes of the full blocks of ``token_ids`` (None when hashing is off).

    Args:
        token_ids: ``array('q')``, list of ints or anything ``array('q', ...)`` accepts.
        block_tokens: tokens per hash block (<= 0: no hashing).
    """
    if block_tokens <= 0:
        return None
    return chain(block_keys(token_ids, block_tokens))


def _max_new(req) -> int:
    try:
        return int(req.sampling_params.max_new_tokens or 0)
    except Exception:
        return 0


def emit_arrival(req) -> None:
    """One ``arrival`` row for a new ``Req``."""
    ids = req.origin_input_ids
    tracer.request(ARRIVAL, state.rid_of(req), state.session_for(getattr(req, "session_id", None)),
                   -1, len(ids), -1, _max_new(req), -1, str(req.rid),
                   page_hashes(ids, hash_block_tokens()))


def emit_finish(req, rid: int) -> None:
    """One ``finish`` (or ``abort``) row for a request whose KV was just released."""
    reason = getattr(req, "finished_reason", None)
    event = ABORT if type(reason).__name__ == "FINISH_ABORT" else FINISH
    tracer.request(event, rid, state.session_for(getattr(req, "session_id", None)), -1,
                   len(req.origin_input_ids), len(req.output_ids), _max_new(req),
                   int(getattr(req, "cached_tokens", -1) or 0), str(req.rid), None)
    state.forget_rid(req.rid)


def _make_req_init():
    def make(orig):
        def init(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            if tracer.pool is not _NOOP:
                try:
                    emit_arrival(self)
                except Exception as e:
                    state.note_failure("request.arrival", e)

        return init

    return make


def install(patcher, lazy: bool = False) -> int:
    """Wrap ``Req.__init__`` (``lazy``: only if already imported). Returns count."""
    from tracer.sglang.patching import target

    sb = target("sglang.srt.managers.schedule_batch", lazy)
    return patcher.wrap_method(sb.Req, "__init__", _make_req_init()) if sb is not None else 0
