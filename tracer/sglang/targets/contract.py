"""``Contract``: what one hook needs of the code it wraps, and the live check of it.

A contract names one wrapped callable (``module``, ``cls`` or None for a module function,
``method``), the exact parameters the hook's wrapper was written for (``params``, compared with
``tracer.sglang.patching.params_of``; None: any), the attributes it reads (``reads``), the levels
that install it and the pools whose occupancy rows depend on it. The check runs at install time
only, on the imported objects; nothing here is on the hot path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

LEVELS = ("steps", "counts", "pages")
ROW_LEVELS = ("counts", "pages")

# Hook states (docs/capture.md "Coverage")
INSTALLED, ABSENT, MISMATCH, SKIPPED, UNUSED = "installed", "absent", "mismatch", "skipped", "unused"


@dataclass(frozen=True)
class Contract:
    """What one hook needs (see the module docstring).

    Attributes:
        hook: the canonical hook name it implements (``tracer.sglang.targets.HOOKS``).
        module: the sglang module defining ``cls`` / the function.
        cls: class name, or None for a module-level function.
        method: method or function name.
        params: the exact parameter string (``params_of`` form), or None when the wrapper is
            generic (``*args, **kwargs``).
        reads: attributes the hook reads: ``"attr"`` on ``cls``'s instances, ``"Class.attr"`` in
            ``module``, or ``"pkg.module:Class.attr"``; an instance attribute counts when a
            method of the class (or a base) assigns ``self.attr``.
        levels: the capture levels that install it (others: ``skipped``).
        optional: its absence does not reduce coverage (a method only some versions have).
    """

    hook: str
    module: str
    cls: str | None
    method: str
    params: str | None = None
    reads: tuple[str, ...] = ()
    levels: tuple[str, ...] = ROW_LEVELS
    optional: bool = False

    @property
    def where(self) -> str:
        return f"{self.module}.{self.cls + '.' if self.cls else ''}{self.method}"


@dataclass(frozen=True)
class Check:
    """A contract's live state: ``installed`` | ``absent`` | ``mismatch`` | ``skipped`` |
    ``unused`` (its module was not imported in this process), with the reason."""

    contract: Contract
    state: str
    reason: str = ""


_file_cache: dict[str, str | None] = {}
_SELF_ASSIGN = r"self\.{attr}\s*(?::[^=\n]+)?=[^=]"


def _class_text(c) -> str | None:
    """The source text of class ``c``'s body: from its ``class`` line to the next top-level
    line of its module's file (read once per file; no parse)."""
    import re

    f = getattr(sys.modules.get(getattr(c, "__module__", "")), "__file__", None)
    if not f or not f.endswith(".py"):
        return None
    text = _file_cache.get(f)
    if f not in _file_cache:
        try:
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            text = None
        _file_cache[f] = text
    if not text:
        return None
    m = re.search(rf"^class {re.escape(c.__name__)}\b", text, re.M)
    if m is None:
        return None
    end = re.compile(r"^[^\s#)\]}]", re.M).search(text, m.end())
    return text[m.start():end.start() if end else len(text)]


def _assigned_in(c, attr: str) -> bool:
    """Whether class ``c``'s own body assigns ``self.<attr>``."""
    import re

    body = _class_text(c)
    return body is not None and re.search(_SELF_ASSIGN.format(attr=re.escape(attr)), body) is not None


def _resolve(module: str, qual: str):
    """``Class.attr`` (or a module-level ``name``) in ``module`` (imported) -> (owner or None,
    attr): the class, or the module itself."""
    mod = sys.modules.get(module)
    cls_name, _, attr = qual.rpartition(".")
    if not cls_name:
        return mod, attr
    return (getattr(mod, cls_name, None) if mod is not None else None), attr


def _has(cls, attr: str) -> bool:
    """Whether instances of ``cls`` have ``attr``: a class attribute (method, property, enum
    member...), an annotation or slot, else a ``self.attr`` assignment in its source."""
    if hasattr(cls, attr):
        return True
    for c in getattr(cls, "__mro__", (cls,)):
        d = getattr(c, "__dict__", {})  # (reading cls.__annotations__ would create it)
        if attr in (d.get("__annotations__") or {}) or attr in (d.get("__slots__") or ()):
            return True
    return any(_assigned_in(c, attr) for c in getattr(cls, "__mro__", (cls,)) if c is not object)


def _missing_reads(c: Contract, owner) -> list[str]:
    out = []
    for r in c.reads:
        if ":" in r:
            mod, qual = r.split(":", 1)
            m = sys.modules.get(mod)
            if m is None or getattr(getattr(m, "__spec__", None), "_initializing", False):
                # another module's class, not imported (yet) in this process: nothing to check
                # against now (the tokenizer manager imports mem_cache.common but never the
                # scheduler's Req); a read the hook body makes guards itself
                continue
            cls, attr = _resolve(mod, qual)
        elif "." in r:
            cls, attr = _resolve(c.module, r)
        else:
            cls, attr = owner, r
        if cls is None:
            out.append(f"{r} (class not found)")
        elif not isinstance(cls, type):
            if not hasattr(cls, attr):
                out.append(r)
        elif not _has(cls, attr):
            out.append(r)
    return out


def check(c: Contract, level: str, is_patched) -> Check:
    """The live state of contract ``c`` at ``level``.

    Args:
        c: the contract.
        level: the capture level installed.
        is_patched: ``is_patched(owner, name) -> bool`` (the ``Patcher``'s), or None to check
            the contract only (state ``installed`` then means "would install": matches).
    """
    from tracer.sglang.patching import params_of

    if level not in c.levels:
        return Check(c, SKIPPED, f"not installed at level {level}")
    mod = sys.modules.get(c.module)
    if mod is None:
        return Check(c, UNUSED, f"{c.module} not imported")
    try:
        owner = getattr(mod, c.cls) if c.cls else mod
    except AttributeError:
        if getattr(getattr(mod, "__spec__", None), "_initializing", False):
            return Check(c, UNUSED, f"{c.module} still importing")
        return Check(c, ABSENT, f"no class {c.cls} in {c.module}")
    fn = getattr(owner, c.method, None)
    if fn is None:
        return Check(c, ABSENT, f"no {c.where}")
    if c.params is not None:
        got = params_of(fn)
        if got != c.params:
            return Check(c, MISMATCH, f"{c.where}{got}; the hook needs {c.params}")
    missing = _missing_reads(c, owner)
    if missing:
        return Check(c, MISMATCH, f"{c.where}: the hook reads {', '.join(missing)}, not in this code")
    if is_patched is None:
        return Check(c, INSTALLED, "matches")
    if c.cls is None:
        ok = is_patched(owner, c.method)
    else:
        from tracer.sglang.patching import _subclasses

        ok = any(is_patched(k, c.method) for k in _subclasses(owner))
    if not ok:
        return Check(c, MISMATCH, f"{c.where} matches but its hook did not wrap it")
    return Check(c, INSTALLED, "")
