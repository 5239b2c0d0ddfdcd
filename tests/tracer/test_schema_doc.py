"""docs/schema.md documents every family, column, enum member and manifest key of the code."""

from __future__ import annotations

import re
from pathlib import Path

from tracer.schema import (
    FAMILIES,
    MANIFEST_KEYS,
    SCHEMA_VERSION,
    CacheOp,
    DropReason,
    Mode,
    Pool,
    PoolOp,
    RequestEvent,
    SchedKind,
    Verdict,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()


def _doc_tables() -> dict[str, list[tuple[str, str]]]:
    out, cur = {}, None
    for line in DOC.splitlines():
        m = re.match(r"^### `(\w+)`", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if line.startswith("## "):
            cur = None
        m = re.match(r"^\| `(\w+)` \| ([^|]+) \|", line)
        if m and cur is not None:
            cur.append((m.group(1), m.group(2).strip()))
    return out


def test_version_is_documented():
    assert f"# Trace schema v{SCHEMA_VERSION}" in DOC


def test_every_family_and_column_is_documented_with_its_type():
    tables = _doc_tables()
    assert set(tables) == set(FAMILIES)
    for name, fam in FAMILIES.items():
        doc_cols = [c for c in tables[name] if c[0] != "rank"]
        code_cols = [(c.name, f"enum `{c.enum.__name__}`" if c.enum else str(c.type)) for c in fam.columns]
        assert doc_cols == code_cols, f"docs/schema.md family {name!r} drifted from tracer/schema"


def test_every_enum_member_is_documented():
    for e in (Pool, PoolOp, CacheOp, SchedKind, Mode, Verdict, RequestEvent, DropReason):
        line = next(ln for ln in DOC.splitlines() if ln.startswith(f"- `{e.__name__}`:"))
        assert line == f"- `{e.__name__}`: " + ", ".join(
            f"{int(m)} `{m.name.lower()}`" for m in sorted(e, key=int))


def test_every_manifest_key_is_documented():
    for k in MANIFEST_KEYS:
        assert f"| `{k}` |" in DOC
