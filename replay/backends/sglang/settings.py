"""Settings of the real-code sglang backend: one frozen dataclass, saved with every result.

Field names, allowed values and defaults come from the one knob table, :mod:`replay.knobs`
(DESIGN.md §5). Each knob maps to a constructor argument / ``ServerArgs`` field of the real
classes, an ``SGLANG_*`` environment switch of sglang 0.5.23 (set only while the backend runs),
or a small listed patch over the real class (``replay.backends.sglang.patches``) where 0.5.23
has no switch (``swa_lru_refresh``, ``swa_admission``, ``host_free``, ``swa_release_boundary``).
``prefix_ownership=eic_release_protected_prefix`` and eviction plug-ins are refused: only the
reference backend expresses them.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from replay import knobs
from replay.backends.settings import BackendSettings

#: Allowed values of the enumerated settings (from the knob table).
CHOICES: dict[str, tuple[str, ...]] = {k.name: k.values for k in knobs.KNOBS if k.values}

#: ``swa_out_of_window_release=off`` turns the decode cadence off with an interval no request reaches.
_NEVER_TOKENS = 1 << 40


@dataclass(frozen=True)
class SglangSettings(BackendSettings):
    """Configuration of one real-code backend run.

    Every field is a knob of :mod:`replay.knobs` (``kvtrace policies`` lists them with help and
    the upstream change each stands for): the knobs both backends take
    (:class:`replay.backends.settings.BackendSettings`) plus ``scheduler``. How each reaches the
    real code:

    - ``swa_lru_refresh=full_ancestry``: patch (pre-#26615), Python tree core (``tree_core=auto``
      picks it);
    - ``swa_admission``: patch of ``SWAPrefillBudget.swa_never_fits`` (``all_or_nothing``: never
      shrink; ``shrink_always``: shrink whenever the SWA need does not fit;
      ``shrink_never_fits``: 0.5.23's own gate, #32700);
    - ``host_free=eager_cat``: patch (pre-#30658); ``device_free``: the allocators' ``need_sort``;
    - ``swa_out_of_window_release``: ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``
      (at unfinished inserts) and ``SGLANG_SWA_EVICTION_INTERVAL`` (decode cadence; ``off`` sets
      an interval no request reaches);
    - ``swa_release_boundary=window_plus_page_cut_to_window``: patch (pre-#29860);
    - sizes: constructor arguments of the real pools, allocators and ``PrefillAdder``;
    - ``step_fixed_ns`` / ``step_per_token_ns``: the virtual clock's step-cost model.
    """

    BACKEND = "sglang"

    scheduler: str = "real"

    def _check_backend(self) -> None:
        if self.swa_lru_refresh == "full_ancestry" and self.resolved_tree_core != "python":
            raise ValueError("swa_lru_refresh=full_ancestry patches the Python tree core; "
                             "set tree_core=python (or auto)")

    @property
    def resolved_tree_core(self) -> str:
        """The tree core the run builds: ``auto`` is rust, python for full-ancestry refresh."""
        if self.tree_core != "auto":
            return self.tree_core
        return "python" if self.swa_lru_refresh == "full_ancestry" else "rust"

    @property
    def need_sort(self) -> bool:
        """The device allocators' ``need_sort`` (``device_free=sorted_merge``)."""
        return self.device_free == "sorted_merge"

    def env(self) -> dict[str, str]:
        """``SGLANG_*`` environment switches this run sets while it runs."""
        release = self.swa_out_of_window_release
        interval = _NEVER_TOKENS if release == "off" else self.swa_eviction_interval_tokens
        return {
            "SGLANG_SWA_EVICTION_INTERVAL": str(interval),
            "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS":
                str(release == "decode_and_unfinished_insert").lower(),
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": self.resolved_tree_core,
        }

    def server(self, *, sglang_version: str = "") -> dict:
        """Manifest ``server`` block (``tracer.schema.SERVER_KEYS``)."""
        return self.server_block(cache_kind="unified_radix", model="kvtrace-sglang-backend",
                                 sglang_version=sglang_version)


def parse_overrides(items: typing.Iterable[str], base: SglangSettings | None = None) -> SglangSettings:
    """Build settings from ``key=value`` strings (``--set``), by the knob table's names.

    Raises:
        ValueError: malformed item, unknown key (message lists the valid keys) or bad value.
    """
    return dataclasses.replace(base or SglangSettings(), **knobs.parse_sets(items))


#: Settings from resolved knob values (:func:`replay.knobs.resolve`).
from_knobs = SglangSettings.from_knobs
#: The knob names the real backend takes, in field order.
setting_names = SglangSettings.setting_names

__all__ = ["CHOICES", "SglangSettings", "from_knobs", "parse_overrides", "setting_names"]
