"""Result and snapshot records returned by the memory model, plus its error types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class MemoryModelError(RuntimeError):
    """A caller broke the contract of a pool or the tree (double free, unknown rid, ...)."""


class IntegrityError(AssertionError):
    """``check_integrity()`` found an inconsistency (a leak, a ledger drift, a lost slot)."""


@dataclass(frozen=True)
class PoolSnapshot:
    """Occupancy of one pool, in tokens (slots).

    The identity ``available + evictable + protected + held == capacity`` always holds;
    ``held`` is request-private (allocated but not in the tree).
    """

    capacity: int
    available: int
    evictable: int
    protected: int
    held: int


@dataclass
class MatchResult:
    """What a prefix match found, in tokens.

    Attributes:
        device_hit_tokens: usable prefix already on device (the request's prefix_len).
        host_hit_tokens: FULL KV below the device hit that only the host holds (load-back).
        swa_host_hit_tokens: host-only SWA within one window above the best match (load-back).
        full_kv_hit_tokens: FULL KV matched on either tier, ignoring the SWA window rule.
        swa_branching_tokens: page-floored full_kv_hit when it lies beyond the SWA boundary.
        prefix_pages: device page ids of the device hit (the request's prefix row).
        last_device_node: node that ends the device hit (lock anchor); the root if none.
        best_match_node: node that ends device + host hit.
        tree_version: the radix tree's version right after the match (None: no tree).
    """

    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    swa_host_hit_tokens: int = 0
    full_kv_hit_tokens: int = 0
    swa_branching_tokens: int | None = None
    prefix_pages: list[int] = field(default_factory=list)
    last_device_node: Any = None
    best_match_node: Any = None
    tree_version: int | None = None  # the tree's ``RadixTree.version`` right after the match


@dataclass
class InsertResult:
    """What an insert did.

    Attributes:
        prefix_tokens: tokens of the key already in the tree before this insert.
        last_node: node the inserted key ends on.
        num_dup_pages: request pages freed because the tree already held them.
        swa_branch_inserted: the insert reached the pending SWA branching point.
        kept_tree_pages: a node past ``prev_prefix_tokens`` kept its own pages (a live node the
            key overlaps): only then do the path's pages there differ from the request's.
    """

    prefix_tokens: int
    last_node: Any
    num_dup_pages: int = 0
    swa_branch_inserted: bool = False
    kept_tree_pages: bool = True


@dataclass
class EvictResult:
    """Tokens freed by one eviction call, per component and tier."""

    full_tokens: int = 0
    swa_tokens: int = 0
    host_full_tokens: int = 0
    host_swa_tokens: int = 0
    num_deleted_nodes: int = 0
    num_demoted_nodes: int = 0
    num_tombstoned_nodes: int = 0
