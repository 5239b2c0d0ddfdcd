"""``kvtrace workload``: generate, import, export and summarize request workloads."""

from __future__ import annotations

import json
import sys
from dataclasses import fields

import click

_PROGRESS = sys.stderr.isatty()


def _run(fn, *args, **kwargs):
    """Call ``fn``; a WorkloadError (a KvtraceError) reaches the one top-level handler of
    :mod:`replay.cli`: ``kvtrace: error: ...`` and exit status 2, like every command."""
    return fn(*args, **kwargs)


@click.group("workload")
def workload() -> None:
    """Request workloads: synthetic shapes, public trace import/export, from a trace, statistics.

    A workload is a trace directory holding only the `request` family (arrival rows with
    chained page hashes) and its manifest; any recorded trace is also a valid workload.
    """


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"expected KEY=VALUE, got {v!r}", param_hint="--set")
        k, _, val = v.partition("=")
        out[k.strip()] = val.strip()
    return out


@workload.command("generate")
@click.option("--shape", required=True, help="Shape name (see `kvtrace workload shapes`).")
@click.option("--requests", "num_requests", type=int, default=1000, show_default=True, help="Arrivals to write.")
@click.option("--qps", type=float, default=None, help="Target request rate (req/s); default: the shape's.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random draw.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Workload directory to create.")
@click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default=None,
              help="Arrival process of sessions/units; default: the shape's (mixed: gamma).")
@click.option("--cv", "arrival_cv", type=float, default=None,
              help="Coefficient of variation of Gamma inter-arrivals (> 1 is bursty).")
@click.option("--hash-block-tokens", type=int, default=16, show_default=True,
              help="Tokens per page hash (replay page sizes must be multiples of it).")
@click.option("--cold-start", is_flag=True, help="Start with an empty system (no sessions under way at t=0).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a shape parameter (repeatable), e.g. --set mean_turns=6.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def generate_cmd(shape, num_requests, qps, seed, out, arrival, arrival_cv, hash_block_tokens, cold_start, sets, force):
    """Generate a synthetic workload of SHAPE (same options and seed: byte-identical files)."""
    from replay.workloads.generate import GenerateOptions, generate_workload
    from replay.workloads.shapes import get_shape, make_config

    def go():
        cfg = make_config(get_shape(shape), _parse_sets(sets))
        opts = GenerateOptions(shape, num_requests, qps, seed, arrival, arrival_cv, hash_block_tokens, not cold_start)
        return generate_workload(out, opts, cfg, overwrite=force, progress=_PROGRESS)

    path = _run(go)
    click.echo(f"wrote {num_requests} requests ({shape}, seed {seed}) to {path}", err=True)


@workload.command("shapes")
def shapes_cmd():
    """List the shapes with their parameters and defaults."""
    from replay.workloads.shapes import SHAPES

    for s in SHAPES.values():
        arrival = s.default_arrival + (f" cv={s.default_cv}" if s.default_arrival == "gamma" else "")
        click.echo(f"{s.name}: {s.summary}")
        click.echo(f"  default qps {s.default_qps}, arrivals {arrival}")
        cfg = s.config_cls()
        for f in fields(cfg):
            click.echo(f"  {f.name} = {getattr(cfg, f.name)}")


@workload.group("import")
def import_group():
    """Import a public request trace (JSONL) as a workload."""


#: ``kvtrace workload import NAME``: (module, function, help) of each public-trace importer; each
#: is called as ``function(file, out, overwrite=, progress=)``.
_IMPORTERS = {
    "mooncake": ("replay.workloads.mooncake", "import_mooncake",
                 "Import a Mooncake trace: JSONL of timestamp (ms), input_length, output_length, hash_ids "
                 "(512-token blocks)."),
    "bailian": ("replay.workloads.bailian", "import_bailian",
                "Import a Qwen-Bailian trace: JSONL of chat_id, parent_chat_id, timestamp (s), input_length, "
                "output_length, turn, type, hash_ids (16-token blocks)."),
}


def _import_command(name: str, module: str, function: str, doc: str) -> click.Command:
    """The ``workload import NAME FILE --out W [--force]`` command of one importer."""

    @import_group.command(name, help=doc)
    @click.argument("file", type=click.Path(dir_okay=False))
    @click.option("--out", required=True, type=click.Path(file_okay=False), help="Workload directory to create.")
    @click.option("--force", is_flag=True, help="Replace --out if it exists.")
    def command(file, out, force):
        import importlib

        importer = getattr(importlib.import_module(module), function)
        path = _run(importer, file, out, overwrite=force, progress=_PROGRESS)
        click.echo(f"imported {file} to {path}", err=True)

    return command


for _name, (_module, _function, _doc) in _IMPORTERS.items():
    _import_command(_name, _module, _function, _doc)


@workload.group("export")
def export_group():
    """Export a workload (or a trace's requests) to a public format."""


@export_group.command("mooncake")
@click.argument("workload_dir", metavar="W", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="JSONL file to write.")
@click.option("--block-tokens", type=int, default=512, show_default=True,
              help="Tokens per exported block id (a multiple of the workload's hash_block_tokens).")
@click.option("--with-sessions", is_flag=True, help="Also write session_id for rows with a known session.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def export_mooncake_cmd(workload_dir, out, block_tokens, with_sessions, force):
    """Write workload W as Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids)."""
    from replay.workloads.mooncake import export_mooncake

    path = _run(export_mooncake, workload_dir, out, block_tokens, with_sessions, overwrite=force, progress=_PROGRESS)
    click.echo(f"wrote {path}", err=True)


@workload.command("from-trace")
@click.argument("trace", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Workload directory to create.")
@click.option("--rank", type=int, default=None, help="Rank whose requests to extract (default: the lowest).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, requests, assumed defaults).")
def from_trace_cmd(trace, out, rank, force, as_json):
    """Extract the arrivals of TRACE (a capture, a recorded run or a workload) into workload --out.

    Hash chains, arrival times, lengths and sessions are copied; what a capture lacks takes the
    documented defaults (output_len from finish rows, turns from session order), listed in the
    output and in the workload's manifest.
    """
    from replay.workloads.extract import extract_workload
    from replay.workloads.read import read_workload

    path = _run(extract_workload, trace, out, rank=rank, overwrite=force)
    w = _run(read_workload, path)
    assumed = w.manifest["workload"]["assumed"]
    if as_json:
        click.echo(json.dumps({"workload": str(path), "trace": trace, "rank": w.manifest["workload"]["rank"],
                               "requests": w.num_requests, "hash_block_tokens": w.hash_block_tokens,
                               "page_hash": w.page_hash, "assumed": assumed}, indent=2))
    else:
        click.echo(f"wrote {w.num_requests} requests from {trace} to {path}"
                   + (f" (assumed: {', '.join(assumed)})" if assumed else ""), err=True)


@workload.command("stats")
@click.argument("workload_dir", metavar="W", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--rank", type=int, default=None, help="Rank whose requests to use (default: the lowest).")
def stats_cmd(workload_dir, as_json, rank):
    """Summarize workload W: rate, lengths, sessions, ideal prefix reuse, context lengths."""
    from replay.workloads.read import read_workload
    from replay.workloads.stats import format_stats, workload_stats

    s = workload_stats(_run(read_workload, workload_dir, rank))
    click.echo(json.dumps(s, indent=2) if as_json else format_stats(s))
