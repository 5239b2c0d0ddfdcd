"""Per-page tree keys of the reference backend's requests.

A page's key is a chained 64-bit hash of everything up to the page's end: ``c_k = c_{k-1} * P +
d_k`` modulo 2^64 (a polynomial over per-page digests ``d_k``) with a final splitmix64, so a run
of pages is keyed with a few numpy operations (no Python call per page). Equal keys = equal
token prefixes (up to a ~2^-63 collision per pair of pages), which is all the tree reads of them.

A page's digest comes from where its tokens come from (:class:`SequenceOrigins`). Token ids are
the real backend's (:class:`replay.backends.sglang.tokens.TokenSynth`): a token of a hash block is
a function of the block's hash and its offset in the block, a request-unique token of the request
and its position, and a turn's first outputs are the next turn's prompt tokens.
- Pages in the sequence's leading run of hash-block tokens (``TokenSynth.block_origin``: the
  prompt's hashed blocks, continued into the outputs copied from the next turn) take their
  digest from the hashes and offsets (:func:`block_page_digests`);
- pages inside one run of request-unique tokens (``TokenSynth.unique_runs``: a prompt's tail past
  its hashed blocks, the outputs a request generates itself) from the request and the position
  (:func:`unique_page_digests`), and pages inside the outputs copied from the next turn's hashed
  blocks past that run (``TokenSynth.copied_blocks``: a prompt whose own tail broke it) from
  those hashes, as the leading run's;
- any other page (where one kind of token meets another) from its token ids
  (:func:`token_page_digests`: each token mixed with its place in the page, splitmix64, summed,
  mixed again), synthesized for that page only.
Which kind a page is depends only on where its tokens and those before it come from, so two
sequences with equal tokens up to a page key it alike: the keys have exactly the equalities of
keys hashed from the token ids alone (``tests/reference/test_keys_reuse.py`` checks the
one-to-one correspondence on every request of the bundled workloads and of Hypothesis sessions at
several page sizes); the hash values differ, which nothing reads. So the scheduler never builds a
prompt's or an output's token ids (``RefReq.plan`` marks only where the EOS is).
"""

from __future__ import annotations

import numpy as np

from replay.backends.sglang.tokens import splitmix64 as _mix64  # wrapping: arrays only, never scalars
from replay.memory.radix.match import GrowingKeys

_MASK = (1 << 64) - 1
_P = (0x100000001B3 * 0x9E3779B97F4A7C15 | 1) & _MASK  # an odd multiplier (invertible mod 2^64)
_P_INV = pow(_P, -1, 1 << 64)
_POS = np.uint64(0xC2B2AE3D27D4EB4F)
_POS_B = np.uint64(0x165667B19E3779F9)  # block-origin digests: place of a block / offset of a page
_SALT_B = np.uint64(0x27D4EB2F165667C5)
_POS_U = np.uint64(0x9FB21C651E98DF25)  # request-unique pages: the page's position
_SALT_U = np.uint64(0xD1B54A32D192ED03)


#: the kinds of digest runs of :meth:`PageKeys._origin_runs`
TOKEN_PAGES, UNIQUE_PAGES, COPIED_PAGES = "tokens", "unique", "copied"


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


def token_page_digests(tokens: np.ndarray, page_size: int) -> np.ndarray:
    """Digests of the whole pages of ``tokens`` (int64 ids) from the ids themselves."""
    m = len(tokens) // page_size
    x = np.ascontiguousarray(tokens[:m * page_size], dtype=np.int64).view(np.uint64).reshape(m, page_size)
    pos = (np.arange(1, page_size + 1, dtype=np.uint64) * _POS)
    return _mix64(_mix64(x + pos).sum(axis=1, dtype=np.uint64))


def block_page_digests(hashes: np.ndarray, block_tokens: int, page_size: int, first: int, end: int) -> np.ndarray:
    """Digests of pages ``first..end-1`` whose tokens are all hash-block tokens (block ``b`` of
    ``hashes`` at position ``b * block_tokens``): from the hashes and offsets, no token ids. A
    page of whole blocks mixes each block's hash with its place in the page; a page inside one
    block mixes the block's hash with the page's offset in it. Only for page sizes that are a
    multiple or a divisor of ``block_tokens``."""
    if page_size % block_tokens == 0:
        k = page_size // block_tokens
        return whole_block_digests(np.asarray(hashes[first * k:end * k], dtype=np.uint64).reshape(end - first, k))
    per = block_tokens // page_size
    j = np.arange(first, end, dtype=np.int64)
    return part_block_digests(np.asarray(hashes, dtype=np.uint64)[j // per], j % per)


def whole_block_digests(h: np.ndarray) -> np.ndarray:
    """Digests of pages of whole hash blocks (a page size a multiple of the block's): ``h`` the
    pages' block hashes, a page per row, in order (uint64)."""
    place = np.arange(1, h.shape[1] + 1, dtype=np.uint64) * _POS_B
    return _mix64(_mix64(h + place).sum(axis=1, dtype=np.uint64) ^ _SALT_B)


def part_block_digests(h: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Digests of pages inside one hash block each (a page size a divisor of the block's): ``h``
    each page's block hash (uint64), ``offsets`` its index among the block's pages (int64)."""
    return _mix64(_mix64(h ^ (offsets + 1).astype(np.uint64) * _POS_B) ^ _SALT_B)


def unique_page_digests(rid: int, start: int, page_size: int, count: int) -> np.ndarray:
    """Digests of ``count`` pages from position ``start`` whose tokens are all unique to request
    ``rid`` (``unique_token_ids``: a function of the request and the position only)."""
    pos = np.arange(start + 1, start + 1 + count * page_size, page_size, dtype=np.uint64)
    return unique_digests(unique_seeds([rid]), pos)


def unique_seeds(rids) -> np.ndarray:
    """Each request's seed of its unique pages' digests (uint64)."""
    return _mix64(np.array([rid & _MASK for rid in rids], dtype=np.uint64) ^ _SALT_U)


def unique_digests(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Digests of request-unique pages: ``seeds`` each page's request seed (``unique_seeds``; or
    one for all), ``positions`` each page's first token position plus one (uint64)."""
    return _mix64(_mix64(seeds + positions * _POS_U) ^ _SALT_U)


def chain_powers(m: int) -> tuple[np.ndarray, np.ndarray]:
    """``P^j`` and ``P^-j`` mod 2^64 for j = 0..m-1 (the chain's, :func:`chain_keys`)."""
    return _POWERS.get(m)


def chain_values_to_keys(chains: np.ndarray) -> np.ndarray:
    """The keys (non-negative, < 2^63) of chain values, as :func:`chain_keys` mixes them."""
    return _mix64(chains) >> np.uint64(1)


def chain_keys(digests: np.ndarray, prev: int = 0, chains: list | None = None) -> tuple[list[int], int]:
    """Keys of pages with these digests chained after ``prev`` (0 at the start of a sequence):
    (keys as non-negative Python ints < 2^63, the chain value after the last page); ``chains``:
    the chain value after each page (a uint64 array) is appended to it."""
    m = len(digests)
    if m == 0:
        return [], prev
    pw, pwi = _POWERS.get(m)
    s = np.cumsum(digests * pwi, dtype=np.uint64) + np.uint64((prev * _P) & _MASK)
    c = pw * s  # c_k = P^k * (P * prev + sum_j d_j P^-j)
    keys = chain_values_to_keys(c).tolist()
    if chains is not None:
        chains.append(c)
    return keys, int(c[-1])


def page_keys(tokens: np.ndarray, page_size: int, prev: int = 0) -> tuple[list[int], int]:
    """Keys of the whole pages of ``tokens`` chained after ``prev``, every page from its token ids.

    Returns:
        (keys as non-negative Python ints < 2^63, the chain value after the last page).
    """
    return chain_keys(token_page_digests(tokens, page_size), prev)


class LazyPrompt:
    """A prompt's token ids synthesized on demand, a slice at a time (``synth.sequence_slice``):
    the pages keyed from block hashes never build theirs."""

    __slots__ = ("synth", "wreq", "length")

    def __init__(self, synth, wreq, length: int) -> None:
        self.synth, self.wreq, self.length = synth, wreq, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop, _ = sl.indices(self.length)
        return self.synth.sequence_slice(self.wreq, start, stop)


class SequenceOrigins:
    """Where the tokens of one request's whole planned sequence come from (see the module
    docstring): its first ``block_end`` tokens are hash-block tokens of ``hashes``
    (``block_tokens`` each); ``runs`` are the maximal runs ``(begin, end, rid)`` of
    request-unique tokens after them; ``tokens(start, stop)`` gives the ids of any other part.

    Args:
        synth: the workload's :class:`replay.backends.sglang.tokens.TokenSynth`.
        wreq: the request's workload row.
    """

    __slots__ = ("synth", "wreq", "block_end", "hashes", "block_tokens", "runs", "copied")

    def __init__(self, synth, wreq) -> None:
        self.synth, self.wreq = synth, wreq
        self.block_end, self.hashes = synth.block_origin(wreq)
        self.block_tokens = synth.block_tokens
        self.runs = synth.unique_runs(wreq, self.block_end)
        # outputs copied from the next turn that are its block tokens, past the leading run
        # (a prompt whose own tail broke the run): ``(begin, end, hashes)`` or None
        self.copied = synth.copied_blocks(wreq, self.block_end)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        return self.synth.planned_slice(self.wreq, start, stop)


class PageKeys:
    """Chained page keys of one token sequence: the prompt, then the tokens of ``extra`` (a list
    the caller appends to, e.g. the request's output ids); keys are computed once per page,
    lazily.

    Args:
        tokens: the prompt's token ids (an array, or a :class:`LazyPrompt`).
        page_size: tokens per page.
        extra: the tokens after the prompt, appended to by the caller (a new list when None).
        origins: the :class:`SequenceOrigins` of the planned sequence (``extra`` a prefix of its
            outputs; only its length is read): pages are keyed from where their tokens come
            from. None: every page from the token ids of ``tokens`` and ``extra``.
    """

    __slots__ = ("prompt", "prompt_len", "extra", "ps", "keys", "_last", "_origins", "_block_pages", "_chains",
                 "_donor", "_table")

    #: pages taken from a donor instead of keyed (a diagnostic: the tests see adoption run)
    adopted_pages = 0

    def __init__(self, tokens, page_size: int, extra: list[int] | None = None,
                 origins: SequenceOrigins | None = None) -> None:
        self.prompt = tokens if isinstance(tokens, LazyPrompt) else np.ascontiguousarray(tokens, dtype=np.int64)
        self.prompt_len = len(self.prompt)
        self.extra = [] if extra is None else extra
        self.ps = page_size
        self.keys: list[int] = GrowingKeys()  # append-only: the tree memoizes its key comparisons
        self._last = 0  # the chain value after the last keyed page
        self._origins = origins
        self._block_pages = 0  # pages keyed from block hashes (the first ones)
        self._chains: list[np.ndarray] = []  # the chain value after each of those keyed so far
        self._donor: tuple | None = None  # whose block pages to take first (``adopt_from``)
        self._table: list[int] | None = None  # every key of the planned sequence (``take_from``)
        if origins is not None and self._block_pages_allowed():
            self._block_pages = origins.block_end // page_size

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.extra)

    def append(self, token: int) -> None:
        self.extra.append(int(token))

    def adopt_from(self, *donors: PageKeys | None) -> None:
        """Take, when the first key is asked for, the leading block pages this sequence shares
        with one of ``donors`` (the same block hashes: the same keys; the one sharing most)
        instead of keying them again (a session's next turn repeats its previous turn's prompt;
        sessions share a system prompt). Only before any key is computed."""
        if self.keys or self._origins is None:
            return
        donors = tuple(d for d in donors if d is not None and d is not self and d._origins is not None)
        if donors:
            self._donor = donors

    def take_from(self, keys: list[int]) -> None:
        """Read the keys from ``keys`` (every page of the whole planned sequence, as this object
        would compute them; :mod:`replay.backends.reference.keytable`) instead of computing
        them. Only before any key is computed."""
        if self.keys:
            return
        self._table, self._donor = keys, None

    def _shared_pages(self, donor: PageKeys, donor_keys: int | None = None) -> int:
        """Leading block pages of this sequence that ``donor`` has keyed (``donor_keys`` pages: by
        default its keys so far) with the same hashes."""
        mine, theirs = self._origins, donor._origins
        ps, bt = self.ps, mine.block_tokens
        if donor.ps != ps or theirs.block_tokens != bt:
            return 0
        pages = min(self._block_pages, donor._block_pages, len(donor.keys) if donor_keys is None else donor_keys)
        if pages <= 0:
            return 0
        slots = pages * (ps // bt) if ps % bt == 0 else -(-pages * ps // bt)  # hash blocks those pages read
        diff = np.flatnonzero(np.asarray(mine.hashes[:slots]) != np.asarray(theirs.hashes[:slots]))
        if len(diff):  # the pages before the first differing block
            pages = min(pages, int(diff[0]) // (ps // bt) if ps % bt == 0 else int(diff[0]) * (bt // ps))
        return pages

    def _adopt(self) -> None:
        donors, self._donor = self._donor, None
        pages, i = max((self._shared_pages(d), i) for i, d in enumerate(donors))
        if pages <= 0:
            return
        donor = donors[i]
        self.keys.extend(donor.keys[:pages])
        PageKeys.adopted_pages += pages
        if len(donor._chains) > 1:  # joined once, for every request that adopts from it
            donor._chains[:] = [np.concatenate(donor._chains)]
        chains = donor._chains[0][:pages]
        self._chains.append(chains)
        self._last = int(chains[-1])

    def _tokens(self, start: int, end: int) -> np.ndarray:
        p = self.prompt_len
        if end <= p:
            return self.prompt[start:end]
        tail = np.array(self.extra[max(0, start - p):end - p], dtype=np.int64)
        return tail if start >= p else np.concatenate((self.prompt[start:p], tail))

    def _origin_digests(self, first: int, end: int) -> np.ndarray:
        """Digests of pages ``first..end-1`` (none in the leading block run): a page inside one
        run of request-unique tokens from the run's request and its position, a page inside the
        copied run of block tokens from their hashes, any other from its ids."""
        ps, org = self.ps, self._origins
        d = np.empty(end - first, dtype=np.uint64)
        for kind, j0, j1, rid in self._origin_runs(first, end):
            d[j0 - first:j1 - first] = (
                token_page_digests(org.tokens(j0 * ps, j1 * ps), ps) if kind is TOKEN_PAGES else
                unique_page_digests(rid, j0 * ps, ps, j1 - j0) if kind is UNIQUE_PAGES else
                block_page_digests(org.copied[2], org.block_tokens, ps, j0, j1))
        return d

    def _origin_runs(self, first: int, end: int):
        """Pages ``first..end-1`` (none in the leading block run) as runs of one kind of digest,
        in order: ``(kind, first page, end page, rid)``, kind one of :data:`TOKEN_PAGES` (where
        kinds of token meet: from their ids), :data:`UNIQUE_PAGES` (inside a run of request
        ``rid``'s unique tokens) and :data:`COPIED_PAGES` (inside the copied run of block tokens,
        ``origins.copied``)."""
        ps, org = self.ps, self._origins
        runs = org.runs
        if org.copied is not None and self._block_pages_allowed():
            runs = sorted((*runs, (org.copied[0], org.copied[1], -1)))
        pos = first  # pages before this are done (the runs are in order and apart)
        for a, b, rid in (*runs, (end * ps, end * ps, -2)):
            j0, j1 = max(first, -(-a // ps)), min(end, b // ps)
            if j0 >= j1 and rid != -2:
                continue  # no whole page inside this run
            if pos < j0:
                yield TOKEN_PAGES, pos, j0, -1
            if j0 < j1:
                yield (UNIQUE_PAGES, j0, j1, rid) if rid >= 0 else (COPIED_PAGES, j0, j1, -1)
            pos = max(pos, j1)

    def _block_pages_allowed(self) -> bool:
        bt = self._origins.block_tokens
        return self.ps % bt == 0 or bt % self.ps == 0

    def covering(self, num_tokens: int) -> list[int]:
        """The object's own key list once it holds at least the keys of the full pages within the
        first ``num_tokens`` tokens (it may hold more: for a reader of that prefix only, as the
        memory model's checkpoint and finish, ``replay.memory.model._held``), without a copy."""
        keys, total = self.keys, self.prompt_len + len(self.extra)
        if len(keys) < (num_tokens if num_tokens < total else total) // self.ps:
            self.up_to(num_tokens)
        return keys

    def up_to(self, num_tokens: int) -> list[int]:
        """Keys of the full pages within the first ``num_tokens`` tokens (the object's own list
        when that is every key computed so far: callers copy, never mutate)."""
        keys = self.keys
        total = self.prompt_len + len(self.extra)
        n = (num_tokens if num_tokens < total else total) // self.ps
        have = len(keys)
        if n == have:
            return keys
        if have < n:
            if self._table is not None:
                if n > len(self._table):
                    raise ValueError(f"page keys: {n} pages asked for, the table holds {len(self._table)}")
                keys.extend(self._table[have:n])
                return keys
            ps, nb, org = self.ps, self._block_pages, self._origins
            if self._donor is not None:
                self._adopt()
                have = len(keys)
                if n <= have:
                    return keys if n == have else keys[:n]
            if have < nb:
                new, self._last = chain_keys(block_page_digests(org.hashes, org.block_tokens, ps, have, min(n, nb)),
                                             self._last, self._chains)
                keys.extend(new)
                have = len(keys)
            if have < n:
                if org is None:
                    new, self._last = page_keys(self._tokens(have * ps, n * ps), ps, self._last)
                else:
                    new, self._last = chain_keys(self._origin_digests(have, n), self._last)
                keys.extend(new)
        return keys if n == len(keys) else keys[:n]


class KeyDonors:
    """Which earlier request each arriving request takes its leading page keys from
    (:meth:`PageKeys.adopt_from`): its session's previous turn, or the last request that began with
    the same hash block (a system prompt shared across sessions). A session's entry goes at its
    last turn, a first block's at the last request that begins with it.

    Args:
        requests: the workload's requests, in arrival order.
        next_turn: rid -> the session's next turn (``TokenSynth._next_turn``).
    """

    def __init__(self, requests, next_turn: dict) -> None:
        self.next_turn = next_turn
        self.session: dict = {}  # session -> the PageKeys of its last arrived turn (not its last)
        # first hash block -> the rid of the last request that begins with it (blocks that begin
        # two or more requests), and -> the PageKeys of the last such request arrived
        self.first_block_last = _shared_first_blocks(requests)
        self.first_block: dict = {}

    def adopt(self, keys: PageKeys, wreq) -> None:
        """Point ``keys`` (of the arriving ``wreq``) at its donors; note it as a later one's."""
        sid = int(wreq.session_id)
        prev = self.session.get(sid) if sid >= 0 else None
        first = int(wreq.page_hashes[0]) if len(wreq.page_hashes) else None
        last = self.first_block_last.get(first)
        keys.adopt_from(prev, self.first_block.get(first))
        if last is not None:
            if last == wreq.rid:
                self.first_block.pop(first, None)
            else:
                self.first_block[first] = keys
        if sid >= 0:
            if wreq.rid in self.next_turn:
                self.session[sid] = keys
            else:
                self.session.pop(sid, None)


def _shared_first_blocks(requests) -> dict[int, int]:
    """First hash block -> the rid of the last request (in arrival order) that begins with it, for
    the blocks that begin two or more requests."""
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    for r in requests:
        if len(r.page_hashes):
            h = int(r.page_hashes[0])
            last[h] = r.rid
            count[h] = count.get(h, 0) + 1
    return {h: rid for h, rid in last.items() if count[h] > 1}


__all__ = ["COPIED_PAGES", "KeyDonors", "LazyPrompt", "PageKeys", "SequenceOrigins", "TOKEN_PAGES", "UNIQUE_PAGES",
           "block_page_digests", "chain_keys", "chain_powers", "chain_values_to_keys", "page_keys", "part_block_digests",
           "token_page_digests", "unique_digests", "unique_page_digests", "unique_seeds", "whole_block_digests"]
