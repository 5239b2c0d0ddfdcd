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
