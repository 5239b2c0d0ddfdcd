"""The DeepSeek-V4 memory stack as replay sizes it: what a DSV4 capture records, and the fork's sizing.

A trace comes from a DSV4 model when its rank entry holds the fork hooks' ``dsv4`` facts
(``tracer/sglang/hooks/fork/dsv4.py``: page size, window, compress ratios, sub-pool sizes), when
its run settings say ``kv_stack=dsv4``, or when the server's model names DeepSeek-V4.
:func:`recorded_settings` is :func:`replay.knobs.recorded_settings` plus, for such a trace, what
the manifest's ``server`` block leaves out, from the rank facts and the ``stats`` rows
(``capacity`` of ``host_full`` / ``host_swa``), and DSV4's defaults where nothing is recorded:
``page_size`` 256 and ``swa_full_tokens_ratio`` 0.1 (the fork's ``apply_deepseek_v4_defaults``).

The fork's sizing, restated for the reference backend and used to pick server arguments that
rebuild recorded sizes (no sglang import here):

- device (``DSV4PoolConfigurator._compute_dsv4_sizes``): full = whole pages of the max tokens;
  SWA = ``int(full * swa_full_tokens_ratio)`` cut to whole pages;
- host (``hybrid_pool_assembler._deepseek_v4_num_host_pages``; ``LogicalHostPool`` is the kv
  anchor, the SWA mirror a ``DeepSeekV4PagedHostPool`` of SWA pages, 256 tokens in paged mode):
  ``max(int(device_pages * hicache_ratio), device_pages + 1)`` pages, for full and for SWA alike,
  with the one ``--hicache-ratio``.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay import knobs

#: what the fork's DSV4 defaults force (``arg_groups/deepseek_v4_hook.py``)
DSV4_PAGE_SIZE = 256
DSV4_SWA_FULL_TOKENS_RATIO = 0.1


def dsv4_facts(source: str | Path) -> dict | None:
    """The ``dsv4`` facts of the first rank file of ``source`` that has them (None: none)."""
    for p in sorted((Path(source) / "ranks").glob("rank=*.json")):
        try:
            info = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("dsv4"), dict):
            return info["dsv4"]
    return None


def _model_is_dsv4(manifest: dict) -> bool:
    model = str((manifest.get("server") or {}).get("model", "")).lower().replace("-", "_")
    return any(s in model for s in ("deepseek_v4", "deepseekv4", "dsv4"))


def is_dsv4(source: str | Path, manifest: dict | None = None) -> bool:
    """``source`` was recorded on a DeepSeek-V4 stack (see the module doc)."""
    if manifest is None:
        from tracer.schema.manifest import read_manifest

        manifest = read_manifest(Path(source))
    run = (manifest.get("run") or {}).get("settings") or {}
    if "kv_stack" in run:
        return run["kv_stack"] == "dsv4"
    return dsv4_facts(source) is not None or _model_is_dsv4(manifest)


def host_capacities(source: str | Path) -> dict[str, int]:
    """Last ``stats`` ``capacity`` per host pool (``host_full``, ``host_swa``) of a trace; {} if none."""
    try:
        import polars as pl

        from replay.trace import open_trace

        t = open_trace(source, strict=False)
        stats = t.lazy("stats").select("seq", "pool", "capacity").collect()
    except Exception:
        return {}
    out = {}
    if stats.height == 0:
        return out
    stats = stats.with_columns(pl.col("pool").cast(pl.Utf8)).sort("seq")
    for name in ("host_full", "host_swa"):
        rows = stats.filter(pl.col("pool") == name)
        if rows.height:
            out[name] = int(rows["capacity"][-1])
    return out


def recorded_settings(source: str | Path, manifest: dict) -> dict[str, object]:
    """Knob values ``source`` records: :func:`replay.knobs.recorded_settings`, completed for a
    DSV4 trace (module doc). A value the manifest records is never replaced."""
    out = knobs.recorded_settings(manifest)
    if not is_dsv4(source, manifest):
        return out
    facts = dsv4_facts(source) or {}
    pools = facts.get("pool_tokens") or {}
    server = manifest.get("server") or {}
    out.setdefault("kv_stack", "dsv4")
    out.setdefault("page_size", int(facts.get("page_size") or DSV4_PAGE_SIZE))
    if facts.get("sliding_window_tokens"):
        out.setdefault("sliding_window_tokens", int(facts["sliding_window_tokens"]))
    if pools.get("full"):
        out.setdefault("full_pool_tokens", int(pools["full"]))
    if pools.get("swa"):
        out.setdefault("swa_pool_tokens", int(pools["swa"]))
    out.setdefault("swa_full_tokens_ratio", DSV4_SWA_FULL_TOKENS_RATIO)
    host = host_capacities(source)
    if "host_pool_tokens" not in out and host.get("host_full"):
        out["host_pool_tokens"] = host["host_full"]
    swa_host = server.get("host_swa_pool_tokens") or host.get("host_swa")
    if out.get("host_pool_tokens") and swa_host and "host_swa_pool_tokens" not in out:
        out["host_swa_pool_tokens"] = int(swa_host)
    return out


# ---------------------------------------------------------------------------------- sizing
def device_pool_tokens(full_pool_tokens: int, swa_full_tokens_ratio: float, *,
                       page_size: int = DSV4_PAGE_SIZE) -> tuple[int, int]:
    """(full, swa) device tokens the fork's ``DSV4PoolConfigurator`` builds."""
    full = full_pool_tokens // page_size * page_size
    return full, int(full * swa_full_tokens_ratio) // page_size * page_size


def host_pages(device_tokens: int, hicache_ratio: float, page_tokens: int) -> int:
    """Host pages of one DSV4 HiCache pool (``_deepseek_v4_num_host_pages``)."""
    pages = -(-device_tokens // page_tokens)
    return max(int(pages * hicache_ratio), pages + 1)


def host_pool_tokens(full_tokens: int, swa_tokens: int, hicache_ratio: float, *,
                     page_size: int = DSV4_PAGE_SIZE, swa_page_size: int = DSV4_PAGE_SIZE) -> tuple[int, int]:
    """(host_full, host_swa) tokens of the fork's DSV4 HiCache stack at ``hicache_ratio``."""
    return (host_pages(full_tokens, hicache_ratio, page_size) * page_size,
            host_pages(swa_tokens, hicache_ratio, swa_page_size) * swa_page_size)


def hicache_ratio_for(full_tokens: int, swa_tokens: int, host_full_tokens: int, host_swa_tokens: int = 0, *,
                      page_size: int = DSV4_PAGE_SIZE, swa_page_size: int = DSV4_PAGE_SIZE) -> float:
    """A ``--hicache-ratio`` with which the fork sizes the host pools ``host_full_tokens`` (and
    ``host_swa_tokens`` when > 0) exactly; the plain ratio when no ratio gives both (the fork
    then builds its own nearest sizes).

    The fork floors ``pages * ratio`` in floats: the ratio is taken just above the smallest
    value that reaches both page counts.
    """
    fp, sp = -(-full_tokens // page_size), -(-swa_tokens // swa_page_size)
    hp = -(-host_full_tokens // page_size)
    lo, hi = hp / fp, (hp + 1) / fp
    if hp <= fp + 1:
        lo, hi = 1.0, (fp + 2) / fp  # the minimum (device pages + 1) wins below
    if host_swa_tokens and sp:
        hsp = -(-host_swa_tokens // swa_page_size)
        if hsp <= sp + 1:
            slo, shi = 1.0, (sp + 2) / sp
        else:
            slo, shi = hsp / sp, (hsp + 1) / sp
        lo, hi = max(lo, slo), min(hi, shi)
    ratio = lo + min((hi - lo) / 2, 1e-6) if hi > lo else host_full_tokens / max(full_tokens, 1)
    return ratio


__all__ = ["DSV4_PAGE_SIZE", "DSV4_SWA_FULL_TOKENS_RATIO", "device_pool_tokens", "dsv4_facts",
           "hicache_ratio_for", "host_capacities", "host_pages", "host_pool_tokens", "is_dsv4",
           "recorded_settings"]
