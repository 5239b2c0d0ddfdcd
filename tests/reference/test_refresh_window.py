"""The waiting-queue refresh's window (``replay.backends.reference.refresh.RefreshWindow``) answers
exactly what walking every request's whole sequence answers: the same best nodes in the same
order where no walk splits a node, None where one would, with no effect on the tree, while the
queue loses heads, gains tails, loses a request from its middle or gets a retracted request back
with a longer sequence, and the tree changes under it (inserts, evictions, splitting matches,
the refreshes' own touches)."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from replay.backends.reference.refresh import RefreshWindow
from replay.memory.radix.match import GrowingKeys
from tests.memory.conftest import seq
from tests.memory.test_walk_memo_paths import PS, make_tree, put, room_for


class Req:
    """A waiting request as the window reads it: ``rid`` and ``whole_keys()``."""

    __slots__ = ("rid", "key")

    def __init__(self, rid: int, key: list[int]) -> None:
        self.rid, self.key = rid, GrowingKeys(key)

    def whole_keys(self) -> GrowingKeys:
        return self.key


def _fresh(tree, head: list) -> list | None:
    """What walking every request of ``head`` gives (head last), as pure reads of plain copies of
    the keys (no memo): the best nodes, or None where a walk would split a node."""
    out = []
    for req in reversed(head):
        walk = tree._match_walk(list(req.whole_keys()), split=False)
        if walk is None:
            return None
        out.append(walk[1])
    return out


def _program(seed: int, width: int) -> tuple[int, int, int]:
    rng = random.Random(seed)
    tree = make_tree(hicache=rng.random() < 0.5, pages=48)
    stems = [seq(t, 8) for t in range(1, 5)]
    rid = iter(range(10**6))

    def key() -> list[int]:
        stem = stems[rng.randrange(len(stems))]
        return stem[: rng.randint(1, 8)] + [9_000 + rng.randrange(5) for _ in range(rng.randint(0, 3))]

    waiting = [Req(next(rid), key()) for _ in range(rng.randint(0, width + 2))]
    admitted: list[Req] = []
    window, requeued = RefreshWindow(), 0
    answered = refused = 0
    for step in range(160):
        op = rng.random()
        if op < 0.15:
            k = key()
            if room_for(tree, len(k)):
                put(tree, k)
        elif op < 0.22:
            tree.evict(full_tokens=rng.randint(1, 4) * PS, swa_tokens=rng.randint(0, 4) * PS)
        elif op < 0.3:
            tree.match(key())  # may split a node
        elif op < 0.4:  # heads admitted
            n = rng.randint(1, 3)
            admitted += waiting[:n]
            del waiting[:n]
        elif op < 0.48:  # arrivals
            waiting += [Req(next(rid), key()) for _ in range(rng.randint(1, 3))]
        elif op < 0.52 and waiting:  # an abort from anywhere in the queue
            waiting.pop(rng.randrange(len(waiting)))
        elif op < 0.56 and admitted:  # a retraction: the request ran, its sequence is longer now
            req = admitted.pop(rng.randrange(len(admitted)))
            req.key = GrowingKeys(list(req.key) + [9_100 + rng.randrange(3)])
            waiting.append(req)
            requeued += 1
        else:  # a refresh
            head = waiting[:width]
            expected = _fresh(tree, head)
            version, clock = tree.version, tree.clock
            got = window.bests(tree, head, requeued)
            assert (tree.version, tree.clock) == (version, clock), f"step {step}: the window changed the tree"
            if expected is None:
                assert got is None, f"step {step}: the window answered where a walk splits a node"
                keys = [req.whole_keys() for req in reversed(head)]
                tree.touch_many(keys)
                window.note(tree, head, keys, requeued)
                refused += 1
            else:
                assert got is not None, f"step {step}: the window refused walks that split nothing"
                assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected)), \
                    f"step {step}: the window's best nodes differ from a fresh walk's"
                tree.apply_touches(got)
                answered += 1
        window.check_integrity(tree, waiting[:width], requeued)
        tree.check_integrity()
    return answered, refused, window.kept


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 6))
def test_the_window_answers_what_walking_every_request_answers(seed, width):
    _program(seed, width)


def test_the_window_keeps_most_walks_and_refuses_where_a_walk_splits():
    """Over fixed seeds the checks above run in every case: answers, refusals and kept memos."""
    answered = refused = kept = 0
    for seed in range(12):
        a, r, k = _program(seed, 5)
        answered, refused, kept = answered + a, refused + r, kept + k
    assert answered > 100 and refused > 10 and kept > 100, (answered, refused, kept)


def test_a_requeued_request_is_walked_again():
    """A request that left the queue and came back with a longer sequence at the same position
    of the window (all heads admitted, this one retracted) is not answered from its old memo."""
    tree = make_tree()
    a_key = seq(1, 6)
    put(tree, a_key)
    put(tree, a_key + seq(2, 2))
    req = Req(1, a_key)
    window = RefreshWindow()
    first = window.bests(tree, [Req(0, seq(3, 2)), req], 0)
    assert first is not None and first[0].key[-1] == a_key[-1]
    req.key = GrowingKeys(a_key + seq(2, 2))  # it ran two pages more, then was retracted
    again = window.bests(tree, [req], 1)
    assert again is not None and again[0].key[-1] == seq(2, 2)[-1], "the old memo answered the longer sequence"
