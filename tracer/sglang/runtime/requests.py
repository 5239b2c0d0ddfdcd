"""``request`` rows from real sglang ``Req`` objects: arrival (written by the ``Req.__init__`` hook,
``hooks/schedule_batch.py``) and finish/abort (the ``release_kv_cache`` hook of a finished
request, ``hooks/mem_cache_common.py``).

Token ids are never stored: the prompt is kept as chained page hashes, one per *full* block of
``hash_block_tokens`` tokens (manifest key; ``KVTRACE_HASH_BLOCK_TOKENS``, default 16; 0 turns
hashing off), computed by the one page-hash function ``tracer.schema.hashing`` from the token
ids (about 60-90 us for a 16k-token prompt).

A driver that synthesizes token ids for a known request row (the real-code replay backend,
which makes token ids from a workload's page hashes) passes them as a :class:`DeclaredPrompt`:
the ``array('q')`` of token ids plus that row's page hashes, session, turn, planned output length
and arrival time. The arrival row then records the declared values (the workload's own hash
chain, not a hash of the synthesized ids; the row is stamped at the declared arrival time on a
``clock="manual"`` recorder), so a recorded run's requests are the workload's requests.

Shared prefixes are written once (schema 1.1, ``tracer.schema.prefixes``): each recording
process keeps a :class:`~tracer.schema.prefixes.PrefixIndex` (``KVTRACE_PREFIX_SLOTS`` slots,
default 2^20 = 16 MiB; 0 stores every chain whole) and an arrival row carries ``prefix_rid``,
``prefix_blocks`` and only the hashes after them. Readers (``replay.trace``) see whole chains.
"""

from __future__ import annotations

import os
from array import array

import numpy as np

import tracer
from tracer.schema import RequestEvent
from tracer.schema.hashing import page_hashes_from_tokens
from tracer.schema.prefixes import PrefixIndex, new_prefix_index
from tracer.sglang.runtime import state

ARRIVAL, FINISH, ABORT = int(RequestEvent.ARRIVAL), int(RequestEvent.FINISH), int(RequestEvent.ABORT)
DEFAULT_HASH_BLOCK_TOKENS = 16


class DeclaredPrompt(array):
    """Prompt token ids with the request row they were synthesized for (see module docstring).

    Build with :func:`declared_prompt`; sglang uses it as the plain ``array('q')`` it is.
    """

    __slots__ = ("page_hashes", "session_id", "turn", "output_len", "arrival_ns")


def declared_prompt(token_ids, *, page_hashes, session_id: int = -1, turn: int = -1,
                    output_len: int = -1, arrival_ns: int | None = None) -> DeclaredPrompt:
    """Token ids (``array('q')`` or int64 numpy array) carrying their request row's facts.

    Args:
        token_ids: the prompt's token ids.
        page_hashes: the row's chained page hashes (uint64), recorded instead of hashing the ids.
        session_id, turn, output_len: the row's values (-1: unknown).
        arrival_ns: the row's arrival time on the trace clock (None: the current clock).
    """
    out = DeclaredPrompt("q")
    out.frombytes(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes()
                  if not isinstance(token_ids, array) else token_ids.tobytes())
    out.page_hashes = np.asarray(page_hashes, dtype=np.uint64)
    out.session_id, out.turn, out.output_len = int(session_id), int(turn), int(output_len)
    out.arrival_ns = None if arrival_ns is None else int(arrival_ns)
    return out


def hash_block_tokens() -> int:
    """Block size in force: the trace manifest's, else ``KVTRACE_HASH_BLOCK_TOKENS``, else 16."""
    rec = state.recorder()
    if rec is not None:
        v = rec.manifest.get("hash_block_tokens")
        if v is not None:
            return int(v)
    return int(os.environ.get("KVTRACE_HASH_BLOCK_TOKENS", DEFAULT_HASH_BLOCK_TOKENS))


def page_hashes(token_ids, block_tokens: int) -> np.ndarray | None:
    """Chained uint64 hashes of the full blocks of ``token_ids`` (None when hashing is off).

    Args:
        token_ids: ``array('q')``, list of ints or any int sequence numpy accepts.
        block_tokens: tokens per hash block (<= 0: no hashing).
    Returns:
        uint64 array, one hash per full block (``tracer.schema.hashing.page_hashes_from_tokens``).
    """
    if block_tokens <= 0:
        return None
    return page_hashes_from_tokens(token_ids, block_tokens)


class _Prefixes:
    """The prefix index of the active recording (a new recording starts an empty one)."""

    recorder = None
    index: PrefixIndex | None = None


def prefix_index() -> PrefixIndex:
    """The active recording's prefix index (created on first use)."""
    rec = state.recorder()
    if _Prefixes.recorder is not rec or _Prefixes.index is None:
        _new_index(rec)
    return _Prefixes.index


def _new_index(rec) -> None:
    """A new recording's prefix index (``new_prefix_index``)."""
    _Prefixes.recorder, _Prefixes.index = rec, new_prefix_index()


state.S.new_recording_listeners.append(_new_index)


def stored_prefix(rid: int, hashes, chained: bool) -> tuple[int, int, np.ndarray | None]:
    """``(prefix_rid, prefix_blocks, hashes to store)`` of an arrival (``PrefixIndex.encode``)."""
    if hashes is None:
        return -1, 0, None
    return prefix_index().encode(rid, hashes, chained=chained)


def _max_new(req) -> int:
    try:
        return int(req.sampling_params.max_new_tokens or 0)
    except Exception:
        return 0


def emit_arrival(req) -> None:
    """One ``arrival`` row for a new ``Req`` (declared values when its prompt is a DeclaredPrompt)."""
    ids = req.origin_input_ids
    if type(ids) is DeclaredPrompt:
        _emit_declared_arrival(req, ids)
        return
    rid = state.rid_of(req)
    prefix_rid, prefix_blocks, new = stored_prefix(rid, page_hashes(ids, hash_block_tokens()), True)
    tracer.request(ARRIVAL, rid, state.session_for(getattr(req, "session_id", None)),
                   -1, len(ids), -1, _max_new(req), -1, str(req.rid), new, prefix_rid, prefix_blocks)


def _emit_declared_arrival(req, ids: DeclaredPrompt) -> None:
    rec = state.recorder()
    at = ids.arrival_ns
    manual = at is not None and rec is not None and rec.opts.clock == "manual"
    if manual:
        now = tracer.tick()
        tracer.set_clock(at)
    try:
        rid = state.rid_of(req)
        prefix_rid, prefix_blocks, new = stored_prefix(rid, ids.page_hashes, False)
        tracer.request(ARRIVAL, rid, ids.session_id, ids.turn, len(ids), ids.output_len,
                       _max_new(req), -1, str(req.rid), new, prefix_rid, prefix_blocks)
    finally:
        if manual:
            tracer.set_clock(now)


def emit_finish(req, rid: int) -> None:
    """One ``finish`` (or ``abort``) row for a request whose KV was just released."""
    reason = getattr(req, "finished_reason", None)
    event = ABORT if type(reason).__name__ == "FINISH_ABORT" else FINISH
    tracer.request(event, rid, state.session_for(getattr(req, "session_id", None)), -1,
                   len(req.origin_input_ids), len(req.output_ids), _max_new(req),
                   int(getattr(req, "cached_tokens", -1) or 0), str(req.rid), None)
    state.forget_rid(req.rid)
