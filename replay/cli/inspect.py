"""``kvtrace inspect TRACE``: manifest, rows per family, ranks, span, drops, bytes on disk."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracer.schema import FAMILIES


def summarize(path: str) -> dict:
    """Summary of a trace (the ``--json`` object of ``kvtrace inspect``)."""
    from replay.trace import open_trace

    tr = open_trace(path, strict=False)
    families = {f: tr.rows(f) for f in FAMILIES}
    lo, hi = None, None
    for seg in tr.segments:
        import pyarrow.parquet as pq

        md = pq.ParquetFile(seg.path).metadata
        col = md.schema.to_arrow_schema().get_field_index("ts_ns")
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(col).statistics
            if st is not None and st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
    num_bytes = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    events = sum(families.values())
    return {
        "path": str(Path(path)),
        "schema_version": tr.manifest.get("schema_version"),
        "producer": tr.manifest.get("producer"),
        "server": tr.manifest.get("server", {}),
        "hash_block_tokens": tr.manifest.get("hash_block_tokens"),
        "families": families,
        "ranks": tr.ranks,
        "span_ns": (hi - lo) if lo is not None else 0,
        "drops": tr.num_dropped,
        "bytes": num_bytes,
        "bytes_per_event": round(num_bytes / events, 3) if events else None,
        "problems": [str(p) for p in tr.problems],
    }


@click.command("inspect")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--strict", is_flag=True, help="Exit with status 1 when the trace has problems.")
def inspect(trace: str, as_json: bool, strict: bool) -> None:
    """Summarize TRACE: manifest, rows per family, ranks, time span, drops, bytes on disk."""
    from replay.trace import TraceError

    try:
        s = summarize(trace)
    except (TraceError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
    else:
        _print(s)
    if strict and s["problems"]:
        raise SystemExit(1)


def _print(s: dict) -> None:
    prod = s["producer"] or {}
    click.echo(f"trace      {s['path']}")
    click.echo(f"schema     {s['schema_version']}  producer {prod.get('name')} {prod.get('version')} "
               f"({prod.get('source')})")
    if s["server"]:
        click.echo("server     " + ", ".join(f"{k}={v}" for k, v in sorted(s["server"].items())))
    click.echo(f"ranks      {s['ranks']}")
    click.echo(f"span       {s['span_ns'] / 1e9:.3f} s")
    click.echo(f"{'family':<10} {'rows':>12}")
    for fam, n in s["families"].items():
        click.echo(f"{fam:<10} {n:>12,}")
    click.echo(f"drops      {s['drops']:,} events lost")
    bpe = s["bytes_per_event"]
    click.echo(f"disk       {s['bytes']:,} bytes" + (f", {bpe:.2f} bytes/event" if bpe else ""))
    for p in s["problems"]:
        click.echo(f"problem    {p}", err=True)
