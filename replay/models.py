"""Model presets: bytes per token of each pool, for traces that do not record them (``--model``).

A capture's rank entry holds the bytes its server computed (``kv_bytes``, written by
``tracer.sglang.runtime.kv_bytes``); a workload, an imported trace or an old capture has none.
``kvtrace replay/sweep --model NAME`` then takes them from this table. Each preset states its
layout; the bytes follow sglang's own pool sizing (docs/capacity.md "Bytes per token" has the
formulas and the source lines):

- MHA (``DefaultPoolConfigurator._compute_cell_size``, 0.5.23 ``pool_configurator.py``):
  ``kv_heads × (head_dim + v_head_dim) × layers × dtype_bytes``;
- hybrid SWA (``HybridSWAPoolConfigurator``): the same per pool, full layers for ``full``, sliding
  layers for ``swa``;
- DeepSeek-V4 (the fork's ``DSV4PoolConfigurator._get_bytes_per_full_token``, split by pool as
  ``tracer.sglang.hooks.fork.dsv4.pool_bytes`` records it).

HiCache host pools store the same bytes per token as their device pool (``MHATokenToKVPoolHost
.get_size_per_token``), so ``host_full`` / ``host_swa`` repeat ``full`` / ``swa``; the DSV4 host
side pools are left out (None: their page layout differs per sub-pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.errors import KvtraceError

POOLS = ("full", "swa", "host_full", "host_swa")


class ModelError(KvtraceError, ValueError):
    """An unknown model preset."""


@dataclass(frozen=True)
class ModelPreset:
    """One preset: its name, what it models, its layout and the bytes per token of each pool."""

    name: str
    description: str
    layout: dict
    bytes_per_token: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "layout": dict(self.layout),
                "bytes_per_token": dict(self.bytes_per_token)}


def mha_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, v_head_dim: int | None = None,
                        dtype_bytes: int = 2) -> int:
    """sglang's MHA cell size: ``kv_heads × (head_dim + v_head_dim) × layers × dtype_bytes``."""
    return kv_heads * (head_dim + (head_dim if v_head_dim is None else v_head_dim)) * layers * dtype_bytes


def dsv4_bytes_per_token(*, compress_ratios, qk_nope_head_dim: int = 448, qk_rope_head_dim: int = 64,
                         index_head_dim: int = 128, window_tokens: int = 128, state_dtype_bytes: int = 4,
                         c4_ring: int = 8, online_c128: bool = False) -> dict:
    """{full, swa} bytes per token of the fork's DSV4 pools (non-speculative, no HiSparse).

    kv = nope + 2·rope + nope/64 + 1 (FlashMLA slot: fp8 nope, bf16 rope, fp8 scales, pad; 584 B),
    idx = index_head_dim + index_head_dim/128·4; A = nope + rope;
    full = n4·kv/4 + n128·kv/128 + n4·idx/4 + n128·(2·A·s) · (1 offline | 1/128 online, 3·A·s);
    swa = L·kv + n4·(c4_ring/window)·(4·A·s + 4·index_head_dim·s).
    """
    ratios = list(compress_ratios)
    n4, n128, layers = ratios.count(4), ratios.count(128), len(ratios)
    kv = qk_nope_head_dim + 2 * qk_rope_head_dim + qk_nope_head_dim // 64 + 1
    idx = index_head_dim + index_head_dim // 128 * 4
    a, s = qk_nope_head_dim + qk_rope_head_dim, state_dtype_bytes
    c128_state = (3 * a * s / 128) if online_c128 else 2 * a * s
    full = n4 * kv / 4 + n128 * kv / 128 + n4 * idx / 4 + n128 * c128_state
    swa = layers * kv + n4 * (c4_ring / window_tokens) * (4 * a * s + 4 * index_head_dim * s)
    return {"full": full, "swa": swa}


def _mha(name: str, description: str, **layout) -> ModelPreset:
    b = float(mha_bytes_per_token(**layout))
    return ModelPreset(name, description, dict(layout, kind="mha"),
                       {"full": b, "swa": None, "host_full": b, "host_swa": None})


def _hybrid(name: str, description: str, *, full_layers: int, swa_layers: int, kv_heads: int,
            head_dim: int, dtype_bytes: int = 2, swa_kv_heads: int | None = None,
            swa_head_dim: int | None = None, sliding_window_tokens: int) -> ModelPreset:
    full = float(mha_bytes_per_token(layers=full_layers, kv_heads=kv_heads, head_dim=head_dim,
                                     dtype_bytes=dtype_bytes))
    swa = float(mha_bytes_per_token(layers=swa_layers, kv_heads=swa_kv_heads or kv_heads,
                                    head_dim=swa_head_dim or head_dim, dtype_bytes=dtype_bytes))
    layout = dict(kind="hybrid_swa", full_layers=full_layers, swa_layers=swa_layers, kv_heads=kv_heads,
                  head_dim=head_dim, dtype_bytes=dtype_bytes, swa_kv_heads=swa_kv_heads or kv_heads,
                  swa_head_dim=swa_head_dim or head_dim, sliding_window_tokens=sliding_window_tokens)
    return ModelPreset(name, description, layout, {"full": full, "swa": swa, "host_full": full, "host_swa": swa})


def _dsv4(name: str, description: str, **layout) -> ModelPreset:
    b = dsv4_bytes_per_token(**layout)
    return ModelPreset(name, description, dict(layout, kind="dsv4", compress_ratios=list(layout["compress_ratios"])),
                       {"full": b["full"], "swa": b["swa"], "host_full": None, "host_swa": None})


#: name -> preset. Layouts marked "assumed" are illustrative (no published config was read).
PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    _mha("llama-3.1-8b", "dense MHA/GQA: Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128, bf16)",
         layers=32, kv_heads=8, head_dim=128, dtype_bytes=2),
    _hybrid("mellum-like-swa", "hybrid SWA in the Mellum style, layout assumed: 28 layers, 21 sliding + 7 "
            "full (3:1), 4 KV heads, head_dim 128, bf16, window 4096",
            full_layers=7, swa_layers=21, kv_heads=4, head_dim=128, sliding_window_tokens=4096),
    _dsv4("deepseek-v4-class", "DeepSeek-V4 class on the fork's DSV4 pools, layer mix assumed: 62 layers, 2 "
          "uncompressed then c4/c128 alternating (30 + 30), nope 448 + rope 64, indexer 128, window 128, fp32 "
          "compress state", compress_ratios=[0, 0] + [4, 128] * 30),
    _dsv4("dsv4-tiny", "the fork tests' tiny DSV4 config (4 layers, ratios 0,4,128,4; window 128)",
          compress_ratios=[0, 4, 128, 4]),
)}


def preset(name: str) -> ModelPreset:
    """The preset called ``name``; raises :class:`ModelError` listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(f"--model {name!r}: unknown model preset; known: {', '.join(PRESETS)}") from None


__all__ = ["ModelError", "ModelPreset", "POOLS", "PRESETS", "dsv4_bytes_per_token", "mha_bytes_per_token",
           "preset"]
