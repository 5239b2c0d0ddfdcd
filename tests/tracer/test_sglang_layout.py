"""The layout of ``tracer/sglang`` (issue 12 item 3): no import cycle, small modules, the versions
declared once, each hook module named after the sglang module whose classes it wraps."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tracer" / "sglang"
# Executed by path (the .pth line, the launch shim), never imported.
EXECUTED = {"tracer.sglang.autoload_boot", "tracer.sglang.activation.autoload_boot"}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _edges(name: str, path: Path, modules: dict) -> set[str]:
    """Modules of the package that ``name`` imports, at module level or inside functions."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            cands = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            cands = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {c for c in cands if c in modules and c != name}
    return out


def test_no_import_cycle_among_the_modules():
    """Every import inside the package (function-level ones too) forms a DAG."""
    mods = _modules()
    graph = {m: _edges(m, p, mods) for m, p in mods.items()}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []
    # the layers: runtime imports neither hooks nor activation; hooks not activation
    for m, deps in graph.items():
        if m.startswith("tracer.sglang.runtime"):
            assert not {d for d in deps if d.startswith(("tracer.sglang.hooks", "tracer.sglang.activation"))}, m
        if m.startswith("tracer.sglang.hooks"):
            assert not {d for d in deps if d.startswith("tracer.sglang.activation")}, m


def test_each_module_imports_alone_in_a_fresh_interpreter():
    names = [m for m in _modules() if m not in EXECUTED]

    def run(m):
        p = subprocess.run([sys.executable, "-c", f"import {m}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        return m, p.returncode, p.stderr[-500:]

    with ThreadPoolExecutor(4) as ex:
        bad = [(m, err) for m, rc, err in ex.map(run, names) if rc != 0]
    assert len(names) >= 20 and bad == []


def test_no_module_over_400_lines():
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_subpackages_and_hook_modules_by_sglang_module():
    mods = _modules()
    for sub in ("runtime", "hooks", "activation"):
        assert f"tracer.sglang.{sub}" in mods
    hooks = {m.rsplit(".", 1)[1] for m in mods if m.startswith("tracer.sglang.hooks.")}
    # named after the sglang module that defines the wrapped classes (see hooks/__init__.py)
    assert {"allocator", "memory_pool", "pool_host", "unified_radix_cache", "mem_cache_common",
            "schedule_policy", "schedule_batch", "scheduler"} <= hooks


def test_no_one_element_list_state_and_no_private_recorder_reads():
    """One state object (``runtime.state.S``), no ``x = [value]`` slots; ``tracer.active()``."""
    bad = []
    for m, p in _modules().items():
        src = p.read_text()
        if "tracer._active" in src:
            bad.append((m, "tracer._active"))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.List) \
                    and len(node.value.elts) >= 1 and all(isinstance(e, ast.Constant) for e in node.value.elts) \
                    and len(node.value.elts) <= 4:
                bad.append((m, node.lineno))
    assert bad == []


def test_supported_versions_declared_once():
    import replay.backends.sglang.env as env
    import tracer.sglang
    from tracer.sglang import versions

    assert env.SUPPORTED_SGLANG_VERSIONS is versions.SUPPORTED_SGLANG_VERSIONS
    assert env.UnsupportedSglangVersion is tracer.sglang.UnsupportedSglang is versions.UnsupportedSglang
    hits = [str(f.relative_to(ROOT)) for d in ("tracer", "replay") for f in (ROOT / d).rglob("*.py")
            if '("0.5.23",)' in f.read_text()]
    assert hits == ["tracer/sglang/versions.py"]
