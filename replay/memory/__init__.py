"""Reference KV memory model: torch pools, the FULL+SWA radix tree with HiCache, and the
request-level ``KVCacheModel`` facade the replay engine drives (DESIGN.md §4).

Owns: device allocators (``allocator``, ``swa_allocator``), the host pool (``host_pool``),
the radix tree (``radix``), the chunk and EIC caches, eviction policies (``policies``), the
frozen config (``config``) and the integrity checks. Every policy variant of DESIGN.md §5 that
lives in the pools or the tree is a config switch.
"""

from replay.memory.config import MemoryConfig
from replay.memory.model import KVCacheModel
from replay.memory.policies import POLICIES
from replay.memory.results import (
    EvictResult,
    InsertResult,
    IntegrityError,
    MatchResult,
    MemoryModelError,
    PoolSnapshot,
)

__all__ = [
    "POLICIES",
    "EvictResult",
    "InsertResult",
    "IntegrityError",
    "KVCacheModel",
    "MatchResult",
    "MemoryConfig",
    "MemoryModelError",
    "PoolSnapshot",
]
