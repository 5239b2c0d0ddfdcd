"""Operations run on several trees side by side (tests that compare two ways of doing one thing)."""

from __future__ import annotations


def evict_all(trees: list, tokens: int) -> None:
    """The same eviction (``tokens`` of FULL and of SWA) on every tree."""
    for tree in trees:
        tree.evict(full_tokens=tokens, swa_tokens=tokens)


def lock_all(trees: list, locks: list[list], key: list[int]) -> None:
    """On every tree, match ``key`` and lock its device anchor (kept in that tree's ``locks``)."""
    for tree, held in zip(trees, locks):
        m = tree.match(list(key))
        if m.last_device_node is not tree.root:
            held.append(tree.lock(m.last_device_node))


def unlock_all(trees: list, locks: list[list]) -> None:
    """On every tree, release its oldest lock still held."""
    for tree, held in zip(trees, locks):
        if held:
            tree.unlock(held.pop(0))
