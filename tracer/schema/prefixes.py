"""Storage form of the ``request`` family's prompt chains (schema 1.1): shared prefixes by reference.

Each turn of a conversation repeats its session's prefix, so most page hashes of a trace repeat
an earlier request's. On disk an arrival row stores

- ``prefix_rid``: an earlier request (same rank) whose chain this prompt extends, -1 none;
- ``prefix_blocks``: how many leading hashes equal that request's (0 with -1);
- ``page_hashes``: only the hashes after those ``prefix_blocks``.

The full chain is ``full(prefix_rid)[:prefix_blocks] + page_hashes``. Rows of schema 1.0 files
(no prefix columns) read as ``-1, 0`` and their ``page_hashes`` are already full. No token ids
are stored and prefix equality stays exact: a reference is only ever made to a request whose
first ``prefix_blocks`` hashes are those of this prompt.

Writers find the longest earlier chain through the *prefix identity* of each block,
``chain(page_hashes)`` (the one chain function applied to the hashes themselves as block keys):
equal identity at block j means equal hashes 0..j, whatever function made the hashes.

- :class:`PrefixIndex`: streaming (the tracer hooks, one per recording process): a
  direct-mapped table of ``slots`` entries (identity -> request, block), 16 bytes per slot, fixed
  memory. An overwritten entry only costs compression (the blocks are stored again), never
  correctness, since a hit compares the full 64-bit identity and the block position.
- :func:`encode_chains`: offline (the workload writer): every earlier chain, exactly.
- :func:`expand_chains` / :func:`expand_request_table`: the one decoder (``replay.trace``).

Schema 1.2, *positions* storage (``kvtrace compact``, ``replay.compact``): with the whole trace in
view every repeated block is a reference, so a new block needs no stored value: its identity is
its position (the row that introduced it, block index). Such a row stores ``new_blocks`` (>= 0)
and an empty ``page_hashes``; the reader gives block ``p`` of row ``i`` the value
:func:`synth_values` ``(salt, rank, seq_i, p)``, a bijection of ``(seq, p)`` (``seq`` < 2**40,
``p`` < 2**24), so values are distinct within a rank by construction and readers see the same
equality structure as the original chains (not the same values; ``tip_hash`` keeps the original
hash of the last block). The salt is in each compacted file's metadata (:data:`SALT_META`).

numpy, pyarrow and the standard library only (runs inside the server).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer.schema.hashing import chain, fmix64

U64 = np.uint64
_POS_BITS = 24  # block position within a prompt (2**24 blocks = 268 M tokens at 16 per block)
_POS_MASK = (1 << _POS_BITS) - 1
_MAX_RID = (1 << (63 - _POS_BITS)) - 1
DEFAULT_SLOTS = 1 << 20  # 16 MiB; ``KVTRACE_PREFIX_SLOTS`` in the hooks
SALT_META = b"kvtrace.chain_salt"  # Parquet schema metadata of a compacted request file (decimal)
SEQ_BITS = 40  # synthesized values: (seq << 24 | block) must fit 64 bits
_RANK_SALT = U64(0xA0761D6478BD642F)


def synth_values(salt: int, rank: int, seqs, positions) -> np.ndarray:
    """Synthesized uint64 value of block ``positions[k]`` introduced by the row of ``seqs[k]``.

    ``fmix64(((seq << 24) | position) ^ K)`` with ``K`` mixed from the trace's salt and the rank:
    fmix64 is a bijection, so distinct ``(seq, position)`` pairs of one rank never share a value.

    Raises:
        ValueError: a seq >= 2**40 or a position >= 2**24 (the pair would not fit 64 bits).
    """
    seqs = np.asarray(seqs, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    if len(seqs) and (int(seqs.min()) < 0 or int(seqs.max()) >= 1 << SEQ_BITS):
        raise ValueError(f"seq {int(seqs.max())} outside 0..2**{SEQ_BITS}; expected smaller seqs to "
                         "synthesize block values")
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) > _POS_MASK):
        raise ValueError(f"block position {int(pos.max())} outside 0..2**{_POS_BITS}; expected shorter prompts")
    with np.errstate(over="ignore"):
        k = fmix64(np.array([fmix64(np.array([int(salt) & ((1 << 64) - 1)], U64))[0] ^ _RANK_SALT], U64)
                   + U64(int(rank) & ((1 << 64) - 1)))[0]
        x = (seqs.astype(U64) << U64(_POS_BITS)) | pos.astype(U64)
        return fmix64(x ^ k)


MAX_SLOTS = 1 << 26  # 1 GiB of table (16 bytes a slot): a larger ``KVTRACE_PREFIX_SLOTS`` is capped


def new_prefix_index() -> PrefixIndex:
    """A recording process's prefix index of ``KVTRACE_PREFIX_SLOTS`` slots (default
    :data:`DEFAULT_SLOTS`, at most :data:`MAX_SLOTS`; 0 stores every chain whole; a value that is
    not a non-negative integer gives the default, logged once), its table touched now: left to
    the first arrivals, the page faults of a lazily mapped table cost ~10 ms of their steps."""
    raw = os.environ.get("KVTRACE_PREFIX_SLOTS", "")
    slots = DEFAULT_SLOTS
    if raw.strip():
        try:
            slots = int(raw)
            if slots < 0:
                raise ValueError
        except ValueError:
            slots = DEFAULT_SLOTS
            _warn_once(f"KVTRACE_PREFIX_SLOTS={raw!r} is not a non-negative integer; using {DEFAULT_SLOTS}")
        if slots > MAX_SLOTS:
            _warn_once(f"KVTRACE_PREFIX_SLOTS={raw!r} is above {MAX_SLOTS}; using {MAX_SLOTS}")
            slots = MAX_SLOTS
    index = PrefixIndex(slots)
    index.ids.fill(0)
    return index


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        logging.getLogger("kvtrace").warning("kvtrace: %s", msg)


class PrefixIndex:
    """Streaming writer side: the longest earlier chain a prompt extends (fixed memory).

    Args:
        slots: table entries (rounded up to a power of two); 0 turns referencing off.
    """

    def __init__(self, slots: int = DEFAULT_SLOTS):
        n = 1 << max(int(slots) - 1, 0).bit_length() if slots > 0 else 0
        self.mask = U64(max(n - 1, 0))
        self.ids = np.zeros(n, U64)
        self.refs = np.full(n, -1, np.int64)  # (rid << 24) | block, -1 empty

    @property
    def num_slots(self) -> int:
        return len(self.ids)

    def encode(self, rid: int, page_hashes, chained: bool = False) -> tuple[int, int, np.ndarray]:
        """Storage form of one arrival's chain, and remember it for later arrivals.

        Args:
            rid: the arriving request's number (< 0 or too large: referenced by nobody).
            page_hashes: its full chain (uint64).
            chained: the hashes come from ``tracer.schema.hashing.chain`` (the hooks' own), so
                each is already its prefix's identity (saves one chain pass).

        Returns:
            ``(prefix_rid, prefix_blocks, new_hashes)``; ``(-1, 0, all)`` when no earlier chain
            shares its first block.
        """
        h = np.asarray(page_hashes, dtype=U64).reshape(-1)
        n = len(h)
        if n == 0 or not len(self.ids):
            return -1, 0, h
        ident = h if chained else chain(h)
        idx = (ident & self.mask).astype(np.intp)
        ids, refs = self.ids, self.refs

        def hit(p: int) -> bool:  # block p of an earlier chain sits in its slot
            i = idx[p]
            r = int(refs[i])
            return r >= 0 and (r & _POS_MASK) == p and ids[i] == ident[p]

        # The blocks found form a prefix of the chain (an earlier chain holding block j holds
        # 0..j) unless a slot was overwritten since, which happens to older blocks first. So
        # gallop back from the last block (n-1, n-2, n-4, ...) to a hit, then bisect towards
        # the miss after it: a few scalar probes instead of a gather over the whole chain. An
        # overwritten slot may make it settle on a shorter prefix, which costs bytes, never
        # correctness (every answer is a verified hit).
        lo, hi, step = -1, n, 1
        p = n - 1
        while p >= 0:
            if hit(p):
                lo = p
                break
            hi, p, step = p, p - step, step * 2
        if lo < 0 and hi > 0 and hit(0):
            lo = 0
        while lo >= 0 and hi - lo > 1:
            mid = (lo + hi) // 2
            if hit(mid):
                lo = mid
            else:
                hi = mid
        if lo >= 0:
            prefix_rid, prefix_blocks = int(refs[idx[lo]]) >> _POS_BITS, lo + 1
        else:
            prefix_rid, prefix_blocks = -1, 0
        if 0 <= rid <= _MAX_RID and prefix_blocks < n and n <= _POS_MASK:
            new = idx[prefix_blocks:]
            ids[new] = ident[prefix_blocks:]
            refs[new] = (int(rid) << _POS_BITS) | np.arange(prefix_blocks, n, dtype=np.int64)
        return prefix_rid, prefix_blocks, h[prefix_blocks:]

    def check_integrity(self) -> None:
        used = self.refs >= 0
        assert len(self.ids) == len(self.refs) and (len(self.ids) & (len(self.ids) - 1)) == 0
        assert np.all((self.ids[used] & self.mask) == np.flatnonzero(used).astype(U64)), "entry in a foreign slot"


def encode_chains(rids, flat, offsets) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Offline writer side: each row's longest prefix shared with an earlier row, exactly.

    Args:
        rids: int64 request number per row (rows in write order; a row may only reference an
            earlier row, and only a rid that occurs once).
        flat: uint64 full chains, concatenated; row i owns ``flat[offsets[i]:offsets[i+1]]``.
        offsets: int64, rows + 1.

    Returns:
        ``(prefix_rid, prefix_blocks, new_flat, new_offsets)`` in the storage form.
    """
    rids = np.asarray(rids, dtype=np.int64)
    flat = np.asarray(flat, dtype=U64)
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    rows = len(lengths)
    prefix_rid = np.full(rows, -1, np.int64)
    prefix_blocks = np.zeros(rows, np.int32)
    if len(flat) == 0:
        return prefix_rid, prefix_blocks, flat, offsets
    row_of = np.repeat(np.arange(rows), lengths)
    pos = np.arange(len(flat), dtype=np.int64) - offsets[row_of]
    ident = chain(flat, lengths)
    _, first, inverse = np.unique(ident, return_index=True, return_inverse=True)
    src = first[inverse]  # first occurrence (flat index) of each block's prefix identity
    uniq, counts = np.unique(rids, return_counts=True)
    single = np.isin(rids, uniq[counts == 1])
    usable = (row_of[src] < row_of) & (pos[src] == pos) & single[row_of[src]]
    # shared blocks: the leading run of usable blocks of each row
    shared = lengths.copy()
    bad = np.flatnonzero(~usable)  # sorted, so the first of each row is where the row changes
    bad_rows = row_of[bad]
    first = np.concatenate([[True], bad_rows[1:] != bad_rows[:-1]]) if len(bad) else np.zeros(0, bool)
    shared[bad_rows[first]] = pos[bad[first]]
    has = np.flatnonzero(shared > 0)
    ref_row = row_of[src[offsets[has] + shared[has] - 1]]  # holds the identity of the last one
    # exact check against the referenced chain (an identity collision cuts the prefix, never lies)
    for i, j in zip(has.tolist(), ref_row.tolist()):
        m = int(shared[i])
        a, b = flat[offsets[i]:offsets[i] + m], flat[offsets[j]:offsets[j] + m]
        if not np.array_equal(a, b):
            shared[i] = int(np.argmin(a == b))
    prefix_rid[has] = np.where(shared[has] > 0, rids[ref_row], -1)
    prefix_blocks[:] = shared
    keep = pos >= np.repeat(shared, lengths)
    new_offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(lengths - shared, out=new_offsets[1:])
    return prefix_rid, prefix_blocks, flat[keep], new_offsets


def expand_chains(rids, seqs, prefix_rid, prefix_blocks, flat, offsets, valid=None):
    """The one decoder: full chains from the storage form (one rank's rows).

    Args:
        rids, seqs: int64 per row (a reference resolves to the row of that rid with the highest
            seq below the referring row's, else the lowest above it).
        prefix_rid, prefix_blocks: per row (stored form).
        flat, offsets: stored hashes, concatenated (row i owns ``flat[offsets[i]:offsets[i+1]]``).
        valid: bool per row, False where ``page_hashes`` is null (never a referent).

    Returns:
        ``(full_flat, full_offsets, ok, problems)``: ``ok`` is False for rows whose chain
        cannot be rebuilt (referent missing, e.g. lost with a dropped or unreadable segment, or
        shorter than ``prefix_blocks``); those rows get an empty chain and a line in
        ``problems`` naming the row and what was expected.
    """
    rids = np.asarray(rids, dtype=np.int64)
    seqs = np.asarray(seqs, dtype=np.int64)
    prid = np.asarray(prefix_rid, dtype=np.int64)
    pblk = np.asarray(prefix_blocks, dtype=np.int64)
    flat = np.asarray(flat, dtype=U64)
    offsets = np.asarray(offsets, dtype=np.int64)
    rows = len(rids)
    valid = np.ones(rows, bool) if valid is None else np.asarray(valid, bool)
    stored = np.diff(offsets)
    refs = np.flatnonzero(valid & (pblk > 0))
    if len(refs) == 0:
        return flat, offsets, valid.copy(), []
    by_rid: dict[int, list[int]] = {}
    for i in np.flatnonzero(valid).tolist():
        by_rid.setdefault(int(rids[i]), []).append(i)
    full_len = np.where(valid, stored, 0).astype(np.int64)
    target = np.full(rows, -1, np.int64)
    ok = valid.copy()
    problems: list[str] = []
    state = np.zeros(rows, np.int8)  # 0 todo, 1 in progress, 2 done
    state[~valid] = 2
    state[np.setdiff1d(np.flatnonzero(valid), refs)] = 2
    order: list[int] = []  # rows with a prefix, referents first

    def referent(i: int) -> int:
        cands = [j for j in by_rid.get(int(prid[i]), ()) if j != i]
        if not cands:
            return -1
        before = [j for j in cands if seqs[j] < seqs[i]]
        return max(before, key=lambda j: seqs[j]) if before else min(cands, key=lambda j: seqs[j])

    for start in refs.tolist():
        stack = [start]
        while stack:
            i = stack[-1]
            if state[i] == 2:
                stack.pop()
                continue
            j = target[i] if state[i] == 1 else referent(i)
            if state[i] == 0:
                state[i], target[i] = 1, j
                if j >= 0 and state[j] != 2:
                    if state[j] == 1:  # a cycle: cannot come from a writer
                        j = target[i] = -1
                    else:
                        stack.append(j)
                        continue
            stack.pop()
            state[i] = 2
            if j < 0 or not ok[j] or full_len[j] < pblk[i]:
                ok[i] = False
                full_len[i] = 0
                why = (f"request rid {int(prid[i])} not found" if j < 0 else
                       f"request rid {int(prid[i])} has {int(full_len[j])} blocks" if ok[j] else
                       f"request rid {int(prid[i])} could not be rebuilt")
                problems.append(f"row with seq {int(seqs[i])} (rid {int(rids[i])}): prefix_rid "
                                f"{int(prid[i])}, prefix_blocks {int(pblk[i])}: {why}; expected an "
                                "earlier arrival holding that prefix")
                continue
            full_len[i] = pblk[i] + stored[i]
            order.append(i)
    out_off = np.zeros(rows + 1, np.int64)
    np.cumsum(full_len, out=out_off[1:])
    out = np.empty(int(out_off[-1]), U64)
    plain = np.flatnonzero(valid & ok & (pblk <= 0))
    if len(plain):  # rows stored whole: one vectorized gather
        src = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in plain.tolist()])
        dst = np.concatenate([np.arange(out_off[i], out_off[i + 1]) for i in plain.tolist()])
        out[dst] = flat[src]
    for i in order:  # referents are filled before the rows that extend them
        j, m, o = int(target[i]), int(pblk[i]), int(out_off[i])
        out[o:o + m] = out[out_off[j]:out_off[j] + m]
        out[o + m:out_off[i + 1]] = flat[offsets[i]:offsets[i + 1]]
    return out, out_off, ok, problems


def expand_request_table(table: pa.Table, *, salt: int | None = None, rank: int = 0) -> tuple[pa.Table, list[str]]:
    """A ``request`` table of one rank with every arrival's full chain in ``page_hashes``.

    Columns missing from older files are added with their defaults first; after expansion
    ``prefix_rid`` is -1, ``prefix_blocks`` 0 and ``new_blocks`` -1 on every row (the chains are
    whole), so expanding twice changes nothing; ``tip_hash`` is kept. Rows stored as positions
    (``new_blocks >= 0``, a compacted trace) get :func:`synth_values` ``(salt, rank, ...)`` for
    their new blocks. Rows whose chain cannot be rebuilt get null ``page_hashes`` and a line in
    the returned problems.

    Raises:
        ValueError: rows stored as positions but no ``salt`` given (the file's metadata lacks it).
    """
    n = table.num_rows
    for name, value, typ in (("prefix_rid", -1, np.int64), ("prefix_blocks", 0, np.int32),
                             ("new_blocks", -1, np.int32), ("tip_hash", 0, np.uint64)):
        if name not in table.column_names:
            table = table.append_column(name, pa.array(np.full(n, value, typ)))
    pblk = pc.fill_null(table.column("prefix_blocks"), 0).to_numpy()
    nblk = pc.fill_null(table.column("new_blocks"), -1).to_numpy().astype(np.int64)
    positions = nblk >= 0
    if n == 0 or not ((pblk > 0).any() or positions.any()):
        return table, []
    hashes = table.column("page_hashes").combine_chunks()
    valid = ~pc.is_null(hashes).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(hashes).to_numpy(zero_copy_only=False).astype(U64)
    if positions.any():
        if salt is None:
            raise ValueError("request rows stored as positions (new_blocks >= 0) but no chain salt; "
                             f"expected {SALT_META.decode()} in the file's metadata")
        flat, offsets = _with_synthesized(flat, offsets, valid & positions, nblk, pblk,
                                          table.column("seq").to_numpy(), salt, rank)
    full, full_off, ok, problems = expand_chains(
        table.column("rid").to_numpy(), table.column("seq").to_numpy(),
        pc.fill_null(table.column("prefix_rid"), -1).to_numpy(), pblk, flat, offsets, valid)
    if full_off[-1] >= 2**31:
        raise ValueError(f"{int(full_off[-1])} page hashes in one rank's request rows; "
                         "expected fewer than 2**31 (list<uint64> offsets)")
    mask = pa.array(~(valid & ok))
    col = pa.ListArray.from_arrays(pa.array(full_off.astype(np.int32)), pa.array(full, pa.uint64()), mask=mask)
    names = table.column_names
    table = table.set_column(names.index("page_hashes"), table.schema.field("page_hashes"), col)
    table = table.set_column(names.index("prefix_rid"), "prefix_rid", pa.array(np.full(n, -1, np.int64)))
    table = table.set_column(names.index("prefix_blocks"), "prefix_blocks", pa.array(np.zeros(n, np.int32)))
    table = table.set_column(names.index("new_blocks"), "new_blocks", pa.array(np.full(n, -1, np.int32)))
    return table, problems


def _with_synthesized(flat, offsets, synth, nblk, pblk, seqs, salt, rank):
    """Stored hashes with each positions row's new blocks filled in (as if they were stored)."""
    stored = np.diff(offsets)
    if (stored[synth] > 0).any():
        i = int(np.flatnonzero(synth & (stored > 0))[0])
        raise ValueError(f"row with seq {int(seqs[i])}: new_blocks {int(nblk[i])} and {int(stored[i])} "
                         "stored hashes; expected an empty page_hashes on a row stored as positions")
    lengths = np.where(synth, nblk, stored)
    out_off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out_off[1:])
    out = np.empty(int(out_off[-1]), U64)
    is_synth = np.repeat(synth, lengths)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    out[~is_synth] = flat  # plain rows keep their stored hashes, in order
    if is_synth.any():
        r = rows[is_synth]
        pos = np.flatnonzero(is_synth) - out_off[r] + pblk[r]
        out[is_synth] = synth_values(salt, rank, np.asarray(seqs, np.int64)[r], pos)
    return out, out_off
