"""One-way imports: tracer <- replay <- notebooks (DESIGN.md §6)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "duckdb", "polars", "plotly", "pandas", "click", "tqdm"}


def _imports(pkg: str):
    for f in (ROOT / pkg).rglob("*.py"):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield f, a.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield f, node.module


def test_tracer_never_imports_replay_or_heavy_packages():
    bad = [(str(f.relative_to(ROOT)), m) for f, m in _imports("tracer")
           if m.split(".")[0] in HEAVY | {"replay", "notebooks"}
           and "tracer/sglang" not in str(f)]
    assert bad == []


def test_replay_imports_only_the_schema_package_from_tracer():
    """DESIGN.md §2: ``replay/`` may import ``tracer.schema``; only the backends that record runs
    (``replay/backends/sglang`` and ``replay/backends/fork`` through their hooks,
    ``replay/backends/reference`` through the
    tracer's emit API, and the recording lifecycle they share, ``replay/backends/base.py``) and
    the record/launch wiring (``replay/record.py``, ``replay/launch.py`` and their CLI wrappers)
    import the tracer runtime and ``tracer.sglang``."""
    bad = [(str(f.relative_to(ROOT)), m) for f, m in _imports("replay")
           if m.split(".")[0] == "tracer" and not (m == "tracer.schema" or m.startswith("tracer.schema."))
           and not _may_run_the_tracer(f)]
    assert bad == []


def _may_run_the_tracer(f: Path) -> bool:
    rel = f.relative_to(ROOT / "replay")
    return (rel.parts[:2] in (("backends", "sglang"), ("backends", "reference"), ("backends", "fork"))
            or rel.parts == ("backends", "base.py")
            or rel.stem in ("record", "launch"))


def test_replay_never_imports_notebooks():
    assert [m for _, m in _imports("replay") if m.split(".")[0] == "notebooks"] == []


def test_tracer_imports_without_heavy_packages():
    code = ("import sys, tracer, tracer.recorder, tracer.schema.storage; "
            f"bad = sorted(m for m in {sorted(HEAVY | {'replay'})!r} if m in sys.modules); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _module_graph() -> dict[str, set[str]]:
    """Project module -> project modules it imports (at any level: function-local imports too,
    ``from pkg import mod`` resolved to the submodule; a module importing its own package is
    not an edge)."""
    mods = {}
    for pkg in ("tracer", "replay", "notebooks"):
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    base = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
                    mod = ".".join(base[: len(base) - node.level + 1] + ([mod] if mod else []))
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                r = resolve(n)
                if r and r != m and not m.startswith(r + "."):
                    graph[m].add(r)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    """No two project modules import each other, directly or around a circle, not even through
    function-local imports (a circle is a layering nobody decided)."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_check_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
