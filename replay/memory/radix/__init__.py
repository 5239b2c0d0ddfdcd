"""Radix (prefix) tree with FULL and SWA components and HiCache tiers.

Owns the tree structure, the evictable/protected ledgers, the SWA LRU lists, the logical
clock, locks, match/insert/evict and host backups. Keys are page hashes; values are page ids.
Policies only rank leaves (``replay.memory.policies``); all bookkeeping lives here.
"""

from replay.memory.radix.integrity import TreeCensus
from replay.memory.radix.node import LRUList, Node
from replay.memory.radix.tree import RadixTree, TreeLock

__all__ = ["LRUList", "Node", "RadixTree", "TreeCensus", "TreeLock"]
