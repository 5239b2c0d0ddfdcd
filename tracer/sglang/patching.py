"""Reversible monkeypatching: wrap methods and module functions, restore the exact originals.

``Patcher.wrap_method(cls, name, make)`` replaces ``cls.__dict__[name]`` by ``make(original)``;
``restore()`` puts back the very same object (``cls.__dict__[name] is original``). Wrapping is
idempotent (a name already wrapped by this patcher is left alone) and only touches classes that
define the name themselves, so inherited methods are wrapped once, where they live.

``wrap_function(module, name, make)`` also rebinds every already-imported ``sglang`` module that
imported the function by name (``from ...common import release_kv_cache``), so callers that hold
their own reference are covered too.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass


_ABSENT = object()  # "original" of an attribute the patch added (restore deletes it)


@dataclass
class _Patch:
    owner: object  # class or module
    name: str
    original: object  # the raw __dict__ entry (function, staticmethod, ...) or _ABSENT
    replacement: object


def _subclasses(cls) -> list[type]:
    """cls and all its (transitive) subclasses currently defined."""
    out, todo, seen = [], [cls], set()
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        try:
            todo.extend(c.__subclasses__())
        except TypeError:  # type.__subclasses__ needs an argument for `type` itself
            pass
    return out


class Patcher:
    """Holds every patch made by the hooks, in order, so that they can be undone exactly."""

    def __init__(self):
        self._patches: list[_Patch] = []
        self._keys: set[tuple[int, str]] = set()

    def __len__(self) -> int:
        return len(self._patches)

    def is_patched(self, owner, name: str) -> bool:
        return (id(owner), name) in self._keys

    def wrap_method(self, cls, name: str, make) -> bool:
        """Wrap ``cls.<name>`` (only if ``cls`` defines it). Returns True when patched now.

        Args:
            cls: the class whose own ``__dict__`` holds the method.
            name: attribute name.
            make: ``make(original_function) -> wrapper function``.
        Mutates: ``cls`` (attribute ``name``) and this patcher's record.
        """
        raw = cls.__dict__.get(name)
        if raw is None or self.is_patched(cls, name):
            return False
        if isinstance(raw, (staticmethod, classmethod)):
            func = raw.__func__
            wrapper = make(func)
            functools.update_wrapper(wrapper, func)
            replacement = type(raw)(wrapper)
        elif callable(raw):
            wrapper = make(raw)
            functools.update_wrapper(wrapper, raw)
            replacement = wrapper
        else:
            return False
        setattr(cls, name, replacement)
        self._record(cls, name, raw, replacement)
        return True

    def wrap_inherited(self, cls, name: str, make) -> bool:
        """Wrap ``cls.<name>`` where ``cls`` inherits it: the wrapper is added to ``cls`` only, so
        the base class (and its other subclasses, e.g. a composite) keep the unwrapped method.
        ``restore()`` deletes the added attribute. Falls back to ``wrap_method`` when ``cls``
        defines ``name`` itself.
        """
        if name in cls.__dict__:
            return self.wrap_method(cls, name, make)
        if self.is_patched(cls, name):
            return False
        func = getattr(cls, name, None)
        if func is None or not callable(func) or isinstance(
                next((c.__dict__[name] for c in cls.__mro__ if name in c.__dict__), None),
                (staticmethod, classmethod)):
            return False
        wrapper = make(func)
        functools.update_wrapper(wrapper, func)
        setattr(cls, name, wrapper)
        self._record(cls, name, _ABSENT, wrapper)
        return True

    def wrap_method_tree(self, base, name: str, make) -> int:
        """Wrap ``name`` on ``base`` and on every subclass that overrides it. Returns count."""
        return sum(self.wrap_method(c, name, make) for c in _subclasses(base))

    def wrap_function(self, module, name: str, make) -> bool:
        """Wrap module-level function ``module.<name>`` and its by-name imports in sglang.

        Mutates: ``module`` and every ``sys.modules['sglang...']`` whose ``<name>`` is the same
        original object or a wrapper of it left by an earlier install (a module imported while
        other hooks were installed, e.g. at another capture level); ``restore`` puts the original.
        """
        orig = module.__dict__.get(name)
        if orig is None or self.is_patched(module, name) or not callable(orig):
            return False
        wrapper = make(orig)
        functools.update_wrapper(wrapper, orig)
        for mod in [module] + [m for k, m in list(sys.modules.items())
                               if k.startswith("sglang") and m is not None and m is not module]:
            try:
                f = mod.__dict__.get(name)
                # (or an earlier install's wrapper of it, bound by a module imported meanwhile)
                if f is orig or (f is not None and getattr(f, "__wrapped__", None) is orig):
                    setattr(mod, name, wrapper)
                    self._record(mod, name, orig, wrapper)
            except Exception:
                continue
        return True

    def _record(self, owner, name, original, replacement) -> None:
        self._patches.append(_Patch(owner, name, original, replacement))
        self._keys.add((id(owner), name))

    def originals(self) -> list[tuple[object, str, object]]:
        """(owner, name, original) of every patch, in patch order (original None: added)."""
        return [(p.owner, p.name, None if p.original is _ABSENT else p.original)
                for p in self._patches]

    def restore(self) -> int:
        """Undo every patch in reverse order; returns how many were undone.

        A patch whose attribute was replaced by someone else since is left as it is.
        """
        n = 0
        for p in reversed(self._patches):
            try:
                if p.owner.__dict__.get(p.name) is p.replacement:
                    if p.original is _ABSENT:
                        delattr(p.owner, p.name)
                    else:
                        setattr(p.owner, p.name, p.original)
                    n += 1
            except Exception:
                pass
        self._patches.clear()
        self._keys.clear()
        return n


def target(name: str, lazy: bool):
    """The sglang module ``name``: imported now, or (``lazy``) only if already imported.

    A lazily found module may still be executing its body (circular imports); callers read its
    attributes inside ``try``/``except AttributeError`` and are called again later.
    """
    if lazy:
        return sys.modules.get(name)
    import importlib

    return importlib.import_module(name)


def params_of(func) -> str:
    """``func``'s parameter list without annotations, e.g. ``"(self, lock)"`` ("?" if unknown).

    The hot-path wrappers have the exact parameters of the method they wrap (a ``*args,
    **kwargs`` wrapper forwards through ``CALL_FUNCTION_EX``, which CPython 3.11 runs in a new
    C-level evaluation loop: several times the cost of an exact call). Each checks the
    original's parameters with this and falls back to a generic wrapper when they differ.
    """
    import inspect

    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "?"
    ps = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=ps, return_annotation=inspect.Signature.empty))


def exact(params: str, make_exact, make_generic):
    """Wrapper factory: ``make_exact(orig)`` when ``orig`` has exactly ``params`` (see
    ``params_of``), else ``make_generic(orig)``."""

    def make(orig):
        return make_exact(orig) if params_of(orig) == params else make_generic(orig)

    return make


def exact_only(params: str, make):
    """Wrapper factory for wrappers written with the exact parameters ``params``: an original
    with other parameters (not sglang 0.5.23) gets a pass-through instead, and the mismatch is
    counted in ``tracer.sglang.failures`` (so tests and ``kvtrace hooks status`` show it)."""

    def make_checked(orig):
        got = params_of(orig)
        if got == params:
            return make(orig)
        from tracer.sglang.runtime.state import note_failure

        note_failure(f"install.{getattr(orig, '__qualname__', orig)}",
                           TypeError(f"parameters {got}, expected {params}: not observed"))

        def passthrough(*args, **kwargs):
            return orig(*args, **kwargs)

        return passthrough

    return make_checked
