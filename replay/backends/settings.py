"""The settings both replay backends share: one frozen dataclass over the knob table.

Every field is a knob of :mod:`replay.knobs`, which supplies its name, type, allowed values,
bounds and default. :class:`BackendSettings` holds the knobs both backends take and the checks
both apply (each value against the table, the values the backend cannot express, the pool
sizes); ``replay.backends.sglang.settings.SglangSettings`` and
``replay.backends.reference.settings.ReferenceSettings`` subclass it, name their backend
(:attr:`BackendSettings.BACKEND`) and add their own fields and checks
(:meth:`BackendSettings._check_backend`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import ClassVar, TypeVar

from replay import knobs

S = TypeVar("S", bound="BackendSettings")


def _default(name: str):
    """The knob table's default of ``name`` (the one place defaults are written)."""
    return knobs.knob(name).default


@dataclass(frozen=True)
class BackendSettings:
    """The knobs both backends take, validated at construction (raises ValueError).

    Subclasses set :attr:`BACKEND` (``sglang`` or ``reference``: the values it cannot express are
    refused with a message naming the backend that can) and may add fields (knobs of the table)
    and checks (:meth:`_check_backend`, run after the shared ones).
    """

    BACKEND: ClassVar[str] = ""

    swa_lru_refresh: str = _default("swa_lru_refresh")
    swa_admission: str = _default("swa_admission")
    host_free: str = _default("host_free")
    swa_out_of_window_release: str = _default("swa_out_of_window_release")
    swa_release_boundary: str = _default("swa_release_boundary")
    prefix_ownership: str = _default("prefix_ownership")
    eviction_policy: str = _default("eviction_policy")
    device_free: str = _default("device_free")
    page_size: int = _default("page_size")
    sliding_window_tokens: int = _default("sliding_window_tokens")
    full_pool_tokens: int = _default("full_pool_tokens")
    swa_pool_tokens: int = _default("swa_pool_tokens")
    swa_full_tokens_ratio: float = _default("swa_full_tokens_ratio")
    chunked_prefill_size: int = _default("chunked_prefill_size")
    max_prefill_tokens: int = _default("max_prefill_tokens")
    max_running_requests: int = _default("max_running_requests")
    host_pool_tokens: int = _default("host_pool_tokens")
    host_swa_pool_tokens: int = _default("host_swa_pool_tokens")
    kv_stack: str = _default("kv_stack")
    hicache_write_policy: str = _default("hicache_write_policy")
    schedule_policy: str = _default("schedule_policy")
    swa_eviction_interval_tokens: int = _default("swa_eviction_interval_tokens")
    tree_core: str = _default("tree_core")
    max_context_tokens: int = _default("max_context_tokens")
    decode_coalescing: str = _default("decode_coalescing")
    stop_on_retraction: str = _default("stop_on_retraction")
    step_fixed_ns: int = _default("step_fixed_ns")
    step_per_token_ns: int = _default("step_per_token_ns")

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                knobs.knob(f.name).parse(getattr(self, f.name))
            except knobs.KnobError as e:
                raise ValueError(str(e)) from None
        knobs.check_backend(self.to_dict(), self.BACKEND)
        if self.full_pool_tokens % self.page_size:
            raise ValueError(f"full_pool_tokens={self.full_pool_tokens} is not a multiple of "
                             f"page_size={self.page_size}")
        if self.has_swa and self.swa_tokens < 2 * self.page_size:
            raise ValueError(f"SWA pool of {self.swa_tokens} tokens is too small for page_size {self.page_size}")
        if self.has_swa and self.sliding_window_tokens >= self.swa_tokens:
            raise ValueError(f"sliding_window_tokens={self.sliding_window_tokens} does not fit the SWA pool "
                             f"of {self.swa_tokens} tokens; expected a window below the pool size")
        if self.host_pool_tokens and self.host_pool_tokens < self.page_size:
            raise ValueError(f"host_pool_tokens={self.host_pool_tokens} is below one page")
        if self.host_swa_pool_tokens and self.kv_stack != "dsv4":
            raise ValueError(f"host_swa_pool_tokens={self.host_swa_pool_tokens} is taken with kv_stack=dsv4 only "
                             "(the generic host SWA pool is sized from host_pool_tokens)")
        self._check_backend()

    def _check_backend(self) -> None:
        """The backend's own checks (raise ValueError); none here."""

    @property
    def has_swa(self) -> bool:
        return self.sliding_window_tokens > 0

    @property
    def has_hicache(self) -> bool:
        return self.host_pool_tokens > 0

    @property
    def swa_tokens(self) -> int:
        """Resolved SWA pool size (page-aligned), 0 without SWA."""
        if not self.has_swa:
            return 0
        raw = self.swa_pool_tokens or int(self.full_pool_tokens * self.swa_full_tokens_ratio)
        return (raw // self.page_size) * self.page_size

    def server_block(self, *, cache_kind: str, model: str, sglang_version: str) -> dict:
        """Manifest ``server`` block (``tracer.schema.SERVER_KEYS``) of a run under these settings."""
        return {
            "page_size": self.page_size, "sliding_window_tokens": self.sliding_window_tokens,
            "full_pool_tokens": self.full_pool_tokens, "swa_pool_tokens": self.swa_tokens,
            "swa_full_tokens_ratio": self.swa_full_tokens_ratio, "chunked_prefill_size": self.chunked_prefill_size,
            "cache_kind": cache_kind, "host_pool_tokens": self.host_pool_tokens,
            "hicache_write_policy": self.hicache_write_policy if self.has_hicache else "",
            "max_prefill_tokens": self.max_prefill_tokens, "max_running_requests": self.max_running_requests,
            "eviction_policy": self.eviction_policy, "schedule_policy": self.schedule_policy,
            "model": model, "sglang_version": sglang_version,
        }

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def setting_names(cls) -> list[str]:
        """The knob names these settings take, in field order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_knobs(cls: type[S], values: dict[str, object]) -> S:
        """Settings from resolved knob values (:func:`replay.knobs.resolve`); knobs the backend
        does not take are ignored."""
        names = set(cls.setting_names())
        return cls(**{k: v for k, v in values.items() if k in names})


__all__ = ["BackendSettings"]
