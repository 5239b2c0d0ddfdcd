"""What a code base's source files say, read without importing them: the package root, module ->
file, a source fingerprint, and the names and parameter shapes an AST pass finds.

Standard library only. Used by :func:`tracer.sglang.targets.detect` (which target is this code?)
and by ``kvtrace hooks check`` on a code base that cannot be imported here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path


def sglang_root() -> Path | None:
    """The directory of the ``sglang`` package this interpreter imports (the imported one when
    it is loaded, else where ``import sglang`` would find it); None when there is none. Never
    imports sglang."""
    mod = sys.modules.get("sglang")
    f = getattr(mod, "__file__", None) if mod is not None else None
    if f:
        return Path(f).resolve().parent
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return Path(spec.origin).resolve().parent
    locs = list(spec.submodule_search_locations or ())
    return Path(locs[0]).resolve() if locs else None


def module_file(root: Path, module: str) -> Path | None:
    """``sglang.srt.a.b`` -> ``root/srt/a/b.py`` (or ``.../b/__init__.py``); None when absent."""
    parts = module.split(".")[1:]
    if not parts:
        p = root / "__init__.py"
        return p if p.is_file() else None
    base = root.joinpath(*parts)
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def fingerprint(root: Path, modules: tuple[str, ...]) -> str:
    """SHA-256 (first 16 hex digits) over each module's name and source bytes, in the given
    order; a module without a file counts as its name plus ``<absent>``."""
    h = hashlib.sha256()
    for m in modules:
        p = module_file(root, m)
        h.update(m.encode() + b"\0")
        h.update(p.read_bytes() if p is not None else b"<absent>")
        h.update(b"\0")
    return h.hexdigest()[:16]


def shape(params: str) -> str:
    """A parameter string reduced to names and markers: ``"(self, a=1, *, b, **kw)"`` ->
    ``"(self, a, *, b, **kw)"`` (defaults and annotations dropped, as the AST and
    ``inspect.signature`` write them differently)."""
    inner = params.strip()
    if not (inner.startswith("(") and inner.endswith(")")):
        return params
    out, depth, cur = [], 0, ""
    for ch in inner[1:-1]:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    names = [p.split("=")[0].split(":")[0].strip() for p in out]
    return "(" + ", ".join(n for n in names if n) + ")"


def _ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    a = fn.args
    names = [x.arg for x in a.posonlyargs]
    if a.posonlyargs:
        names.append("/")
    names += [x.arg for x in a.args]
    if a.vararg is not None:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg is not None:
        names.append("**" + a.kwarg.arg)
    return "(" + ", ".join(names) + ")"


@dataclass
class ClassFacts:
    bases: list[str] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)  # name -> parameter shape
    attrs: set[str] = field(default_factory=set)  # class-level names and self.X assignments


@dataclass
class FileFacts:
    """Top-level functions (name -> parameter shape) and classes of one source file."""

    functions: dict[str, str] = field(default_factory=dict)
    classes: dict[str, ClassFacts] = field(default_factory=dict)


def file_facts(path: Path) -> FileFacts:
    """Parse ``path`` (never executed) into its functions, classes, methods and attributes."""
    tree = ast.parse(path.read_bytes(), str(path))
    out = FileFacts()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.functions[node.name] = _ast_params(node)
        elif isinstance(node, ast.ClassDef):
            cf = ClassFacts(bases=[ast.unparse(b) for b in node.bases])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    cf.methods[item.name] = _ast_params(item)
                    cf.attrs.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    cf.attrs.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    cf.attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for sub in ast.walk(node):
                tgt = sub.target if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else None
                tgts = sub.targets if isinstance(sub, ast.Assign) else ([tgt] if tgt else [])
                for t in tgts:
                    for e in ast.walk(t):
                        if (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                                and e.value.id == "self"):
                            cf.attrs.add(e.attr)
            out.classes[node.name] = cf
    return out


class SourceIndex:
    """Facts of a code base's modules, parsed on first use (one parse per file)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._facts: dict[str, FileFacts | None] = {}

    def facts(self, module: str) -> FileFacts | None:
        if module not in self._facts:
            p = module_file(self.root, module)
            try:
                self._facts[module] = file_facts(p) if p is not None else None
            except (SyntaxError, OSError, ValueError):
                self._facts[module] = None
        return self._facts[module]

    def lookup(self, module: str, qualname: str) -> tuple[bool, str | None]:
        """Whether ``module`` defines ``qualname`` (``func``, ``Class``, ``Class.method`` or
        ``Class.attr``; a method or attribute may come from a base class defined in the same
        module), and the parameter shape when it is a function or method."""
        ff = self.facts(module)
        if ff is None:
            return False, None
        if "." not in qualname:
            if qualname in ff.functions:
                return True, ff.functions[qualname]
            return qualname in ff.classes, None
        cls, name = qualname.split(".", 1)
        seen = set()
        while cls in ff.classes and cls not in seen:
            seen.add(cls)
            cf = ff.classes[cls]
            if name in cf.methods:
                return True, cf.methods[name]
            if name in cf.attrs:
                return True, None
            cls = next((b.split(".")[-1] for b in cf.bases if b.split(".")[-1] in ff.classes), "")
        return False, None
