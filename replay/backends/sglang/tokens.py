"""Deterministic token ids for workloads that carry only chained page hashes.

A workload stores, per request, one chained hash per ``hash_block_tokens`` block of the prompt.
Token ids of block ``i`` are a pure function of that block's hash, so two prompts with equal
hash prefixes get equal token prefixes and the real radix tree shares exactly the blocks the
workload shares (and nothing else, up to a 2^-31 collision per token). Positions past the
hashed blocks get ids unique to the request.

The prompt ids carry the request's workload row to the tracer hooks (``prompt_ids``), so the
arrival rows of a recorded run hold the workload's page hashes, not a hash of these ids.

Output tokens: when the next turn of the same session extends this prompt (all full blocks
equal), the generated tokens are the next turn's prompt tokens at the same positions, so the
next turn can hit the KV the previous turn decoded, as it would on a real server. Otherwise
they are unique to the request. The last token is :data:`EOS_TOKEN_ID` when the request stops
before its ``max_new_tokens``.
"""

from __future__ import annotations

import numpy as np

from replay.workloads.io import Workload, WorkloadRequest
from tracer.sglang.runtime.requests import DeclaredPrompt, declared_prompt

EOS_TOKEN_ID = 0  # never produced for prompts: synthesized ids are in [1, TOKEN_ID_LIMIT)
TOKEN_ID_LIMIT = (1 << 31) - 1

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_SALT_UNIQUE = np.uint64(0xD6E8FEB86659FD93)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer over a uint64 array (wrapping arithmetic: numpy warns of overflow only
    in scalar arithmetic, so every caller passes an array and no ``errstate`` is entered, which
    cost more than the arithmetic on a request's few pages)."""
    x = x ^ (x >> _S30)  # a new array: the caller's is never written; the rest in place
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _to_ids(x: np.ndarray) -> np.ndarray:
    return (x % np.uint64(TOKEN_ID_LIMIT - 1)).astype(np.int64) + 1


def block_token_ids(page_hashes: np.ndarray, block_tokens: int) -> np.ndarray:
    """Token ids of whole hash blocks.

    Args:
        page_hashes: uint64 chained block hashes.
        block_tokens: tokens per block.
    Returns:
        int64 array of ``len(page_hashes) * block_tokens`` ids in [1, TOKEN_ID_LIMIT).
    """
    hashes = np.asarray(page_hashes, dtype=np.uint64)
    offsets = np.arange(1, block_tokens + 1, dtype=np.uint64)
    x = hashes[:, None] + offsets[None, :] * _GOLDEN  # arrays: wrapping, no warning
    return _to_ids(splitmix64(x)).reshape(-1)


def unique_token_ids(rid: int, start: int, stop: int) -> np.ndarray:
    """Ids for positions [start, stop) that belong to request ``rid`` only."""
    pos = np.arange(start + 1, stop + 1, dtype=np.uint64)
    seed = splitmix64(np.array([np.uint64(rid) ^ _SALT_UNIQUE], dtype=np.uint64))  # shape (1,): array arithmetic
    return _to_ids(splitmix64(seed + pos * _GOLDEN))


class TokenSynth:
    """Token ids for every request of one workload.

    Args:
        workload: the workload (its ``hash_block_tokens`` and session/turn layout are used).
    """

    def __init__(self, workload: Workload) -> None:
        self.block_tokens = workload.hash_block_tokens
        self._next_turn: dict[int, WorkloadRequest] = {}
        self._copied: dict[int, tuple[WorkloadRequest | None, int]] = {}  # rid -> ``_copied_from``
        by_session: dict[int, list[WorkloadRequest]] = {}
        for r in workload.requests:
            if r.session_id >= 0 and r.turn >= 0:
                by_session.setdefault(r.session_id, []).append(r)
        for turns in by_session.values():
            turns.sort(key=lambda r: (r.turn, r.arrival_ns, r.rid))
            for cur, nxt in zip(turns, turns[1:]):
                self._next_turn[cur.rid] = nxt

    def _sequence(self, req: WorkloadRequest, length: int) -> np.ndarray:
        covered = min(length, len(req.page_hashes) * self.block_tokens)
        nblocks = -(-covered // self.block_tokens)
        head = block_token_ids(req.page_hashes[:nblocks], self.block_tokens)[:covered]
        if covered >= length:
            return head
        return np.concatenate([head, unique_token_ids(req.rid, covered, length)])

    def sequence_slice(self, req: WorkloadRequest, start: int, stop: int) -> np.ndarray:
        """``_sequence(req, L)[start:stop]`` for any ``L >= stop``, computing only those positions
        (block tokens of the blocks they overlap, request-unique tokens past the hashed blocks:
        both depend on the absolute position only)."""
        bt = self.block_tokens
        covered = len(req.page_hashes) * bt
        start, stop = max(0, start), max(start, stop)
        parts = []
        if start < min(stop, covered):
            b0, b1 = start // bt, -(-min(stop, covered) // bt)
            ids = block_token_ids(req.page_hashes[b0:b1], bt)
            parts.append(ids[start - b0 * bt: min(stop, covered) - b0 * bt])
        if stop > covered:
            parts.append(unique_token_ids(req.rid, max(start, covered), stop))
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def prompt_ids(self, req: WorkloadRequest) -> DeclaredPrompt:
        """Prompt token ids (``input_len`` of them) as the ``array('q')`` sglang's Req takes.

        The array is a :class:`tracer.sglang.requests.DeclaredPrompt`: it also carries the
        request's row (page hashes, session, turn, planned output, arrival time), which the
        tracer hooks record for its arrival instead of hashing the synthesized ids. So a
        recorded run's request rows are the workload's rows (``workload from-trace`` gives the
        workload back).
        """
        return declared_prompt(self._sequence(req, req.input_len), page_hashes=req.page_hashes,
                               session_id=req.session_id, turn=req.turn, output_len=req.output_len,
                               arrival_ns=req.arrival_ns)

    def _copied_from(self, req: WorkloadRequest) -> tuple[WorkloadRequest | None, int]:
        """(the next turn whose prompt tokens the first outputs are, how many), or (None, 0): the
        next turn of the session extends this prompt (all its full blocks equal)."""
        got = self._copied.get(req.rid)
        if got is None:
            got = self._copied[req.rid] = self._copied_from_uncached(req)
        return got

    def _copied_from_uncached(self, req: WorkloadRequest) -> tuple[WorkloadRequest | None, int]:
        nxt = self._next_turn.get(req.rid)
        full = req.input_len // self.block_tokens
        if (nxt is not None and nxt.input_len > req.input_len and full <= len(nxt.page_hashes)
                and full <= len(req.page_hashes)
                and np.array_equal(nxt.page_hashes[:full], req.page_hashes[:full])):
            return nxt, min(req.output_len, nxt.input_len - req.input_len)
        return None, 0

    def _copied_run(self, req: WorkloadRequest) -> tuple[int, np.ndarray] | None:
        """``(end, hashes)``: the outputs from ``input_len`` to ``end`` are the next turn's
        hash-block tokens (block ``p // block_tokens`` of ``hashes``, the next turn's); None when
        none are (no copy, or the copy starts past the next turn's hashed blocks)."""
        nxt, shared = self._copied_from(req)
        if shared and shared == req.output_len and req.output_len < req.max_new_tokens:
            shared -= 1  # the last output is EOS
        if nxt is None or shared <= 0:
            return None
        end = min(req.input_len + shared, len(nxt.page_hashes) * self.block_tokens, nxt.input_len)
        return (end, nxt.page_hashes) if end > req.input_len else None

    def block_origin(self, req: WorkloadRequest) -> tuple[int, np.ndarray]:
        """The leading tokens of the request's whole sequence (prompt, then :meth:`output_ids`) that
        are all tokens of hash blocks, each block's from one hash: ``(B, hashes)``, every token at
        position ``p < B`` being :func:`block_token_ids` of ``hashes[p // block_tokens]`` at offset
        ``p % block_tokens``. The prompt's hashed blocks, continued into the outputs copied from the
        next turn where the prompt ends inside the hashed blocks and no block changes its hash
        there. A function of the tokens' origins only, so two sequences with the same tokens up to
        ``p <= B`` agree on it (``replay.backends.reference.keys`` keys such pages by hash)."""
        bt, n = self.block_tokens, req.input_len
        own = req.page_hashes
        covered = min(n, len(own) * bt)
        if covered < n:  # the prompt's tail is the request's own tokens
            return covered, own
        run = self._copied_run(req)
        if run is None or (n % bt and own[n // bt] != run[1][n // bt]):  # none copied, or a block changes hash
            return covered, own
        return run

    def copied_blocks(self, req: WorkloadRequest, start: int) -> tuple[int, int, np.ndarray] | None:
        """``(begin, end, hashes)``: the outputs copied from the next turn that are its hash-block
        tokens (block ``p // block_tokens`` of ``hashes``), from position ``start`` on (the end of
        :meth:`block_origin`'s run: where the prompt's own tail or a block that changes hash broke
        it); None when there are none."""
        run = self._copied_run(req)
        if run is None:
            return None
        begin = max(req.input_len, start)
        return (begin, run[0], run[1]) if begin < run[0] else None

    def unique_runs(self, req: WorkloadRequest, start: int) -> list[tuple[int, int, int]]:
        """The maximal runs ``(begin, end, rid)`` of request-unique tokens (:func:`unique_token_ids`
        of ``rid``) in the request's whole sequence (prompt, then :meth:`output_ids`) at or after
        position ``start``, in order: the prompt's tail past its hashed blocks, the outputs it
        generates itself and, among those copied from the next turn, the next turn's own tail.
        The closing EOS is in none."""
        bt, n, n_out = self.block_tokens, req.input_len, req.output_len
        end = n + n_out - (1 if n_out < req.max_new_tokens else 0)  # the EOS is no request's token
        runs = []
        covered = min(n, len(req.page_hashes) * bt)
        if covered < n:
            runs.append([covered, n, req.rid])
        nxt, shared = self._copied_from(req)
        if nxt is not None and shared > 0:
            theirs = min(nxt.input_len, len(nxt.page_hashes) * bt)
            lo, hi = max(n, theirs), min(n + shared, end)
            if lo < hi:
                runs.append([lo, hi, nxt.rid])
        own = n + shared
        if own < end:
            if runs and runs[-1][1] == own and runs[-1][2] == req.rid:
                runs[-1][1] = end
            else:
                runs.append([own, end, req.rid])
        return [(max(a, start), b, rid) for a, b, rid in runs if b > start]

    def planned_slice(self, req: WorkloadRequest, start: int, stop: int) -> np.ndarray:
        """Token ids ``[start, stop)`` of the request's whole sequence (prompt, then
        :meth:`output_ids`), computing only those positions."""
        n = req.input_len
        if stop <= n:
            return self.sequence_slice(req, start, stop)
        tail = self.output_slice(req, max(start, n), stop)
        return tail if start >= n else np.concatenate((self.sequence_slice(req, start, n), tail))

    def output_slice(self, req: WorkloadRequest, start: int, stop: int) -> np.ndarray:
        """``output_ids(req)`` at sequence positions ``[start, stop)`` (``input_len <= start``;
        cut at the last output), as int64 ids, computing only those positions (a page of the
        outputs needs its own ids, not the whole output's)."""
        n, n_out = req.input_len, req.output_len
        start, stop = max(start, n), min(stop, n + n_out)
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        ids = unique_token_ids(req.rid, start, stop)
        nxt, shared = self._copied_from(req)
        if nxt is not None and start < n + shared:
            end = min(stop, n + shared)
            ids[:end - start] = self.sequence_slice(nxt, start, end)
        if n_out < req.max_new_tokens and stop == n + n_out:
            ids[-1] = EOS_TOKEN_ID
        return ids

    def output_ids(self, req: WorkloadRequest) -> list[int]:
        """The ``output_len`` tokens the request will generate, in order."""
        n_out = req.output_len
        ids = unique_token_ids(req.rid, req.input_len, req.input_len + n_out)
        nxt, shared = self._copied_from(req)
        if nxt is not None:
            ids[:shared] = self.sequence_slice(nxt, req.input_len, req.input_len + shared)
        tokens = ids.tolist()
        if n_out < req.max_new_tokens:
            tokens[-1] = EOS_TOKEN_ID
        return tokens
