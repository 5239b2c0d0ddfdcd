"""FULL eviction strategies, registered by name.

A strategy only ranks: ``priority(node) -> tuple`` and the smallest tuple is evicted first. The
tree owns all bookkeeping (which leaves are evictable, the heap, the frees). Strategies read the
node fields ``last_access`` (logical clock), ``creation_time`` (logical clock), ``hit_count`` and
``priority`` (request priority).

Users register their own with ``POLICIES.register("name")(cls)`` or by import path
``"pkg.mod:Class"`` passed wherever a name is accepted.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol


class EvictionPolicy(Protocol):
    """Ranks evictable leaves; smaller evicts first."""

    def priority(self, node: Any) -> tuple: ...


class Registry:
    """Name → policy class. A bad name fails listing the known ones."""

    def __init__(self) -> None:
        self._classes: dict[str, type] = {}

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator registering ``cls`` under ``name``.

        Raises:
            ValueError: when the name is taken by another class.
        """

        def deco(cls: type) -> type:
            old = self._classes.get(name)
            if old is not None and old is not cls:
                raise ValueError(f"eviction policy {name!r} is already registered")
            self._classes[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._classes)

    def register_path(self, path: str, name: str | None = None) -> str:
        """Import ``"pkg.mod:Class"`` and register it (under ``name`` or the path itself).

        Returns:
            the name it is registered under.
        Raises:
            ValueError: malformed path, or the attribute is not a policy class.
            ImportError: the module cannot be imported.
        """
        mod_name, sep, attr = path.partition(":")
        if not sep or not mod_name or not attr:
            raise ValueError(f"policy import path must look like 'pkg.mod:Class', got {path!r}")
        cls = getattr(importlib.import_module(mod_name), attr, None)
        if not isinstance(cls, type) or not callable(getattr(cls, "priority", None)):
            raise ValueError(f"{path!r} is not a class with a priority(node) method")
        key = name or path
        self.register(key)(cls)
        return key

    def create(self, name: str) -> EvictionPolicy:
        """Instantiate the policy ``name`` (or import path).

        Raises:
            ValueError: unknown name, listing the known ones.
        """
        if name not in self._classes and ":" in name:
            self.register_path(name)
        cls = self._classes.get(name)
        if cls is None:
            raise ValueError(
                f"unknown eviction policy {name!r}; known: {', '.join(self.names())} "
                "(or an import path 'pkg.mod:Class')"
            )
        return cls()


POLICIES = Registry()


@POLICIES.register("lru")
class LRU:
    """Least recently used first."""

    def priority(self, node: Any) -> tuple:
        return (node.last_access,)


@POLICIES.register("lfu")
class LFU:
    """Fewest hits first, then least recently used."""

    def priority(self, node: Any) -> tuple:
        return (node.hit_count, node.last_access)


@POLICIES.register("fifo")
class FIFO:
    """Oldest created first."""

    def priority(self, node: Any) -> tuple:
        return (node.creation_time,)


@POLICIES.register("mru")
class MRU:
    """Most recently used first."""

    def priority(self, node: Any) -> tuple:
        return (-node.last_access,)


@POLICIES.register("filo")
class FILO:
    """Newest created first."""

    def priority(self, node: Any) -> tuple:
        return (-node.creation_time,)


@POLICIES.register("priority")
class Priority:
    """Lowest request priority first, then least recently used."""

    def priority(self, node: Any) -> tuple:
        return (node.priority, node.last_access)
