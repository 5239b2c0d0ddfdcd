"""The one table of policy knobs and sizes (DESIGN.md §5), the presets, and ``--set`` parsing.

Every knob is defined once here: name (with units, matching the server argument where one
exists), type, allowed values, default, the upstream change it stands for, and help. Both
backends take these names; their configs (``replay.backends.sglang.settings.SglangSettings``,
``replay.memory.config.MemoryConfig``) read allowed values from this table. A backend that
cannot express a value refuses it with a message naming the backend that can
(:func:`check_backend`).

Presets are named sets of knob values applied over a base (the trace's recorded settings for
``recorded``, the defaults otherwise):

- ``recorded``: the settings in the trace's manifest (sizes and the policies it names);
- ``swa-fixes``: sglang 0.5.23's behaviour (window-aware refresh, shrink only prompts that never
  fit, lazy host free, out-of-window release in decode and at unfinished inserts, the
  ``max(W, ps)`` boundary). It is *not* bytedance-iaas/sglang#659 (see ``fork-659``);
- ``fork-659``: what the fork's #659 code does, read from its diff and checked against the
  post659 commit (``tests/claims/test_fork_659.py``): ``swa-fixes`` with
  ``swa_admission=shrink_always`` (its ``_swa_chunk_cap`` shrinks whenever SWA cannot admit a
  chunk) and ``swa_out_of_window_release=decode_only`` (the release at unfinished inserts is
  opt-in, ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``, default off);
- ``baseline``: every pre-fix behaviour;
- one single-knob step per fix in each direction: ``baseline+<value>`` (baseline with one fix)
  and ``swa-fixes-<value>`` (swa-fixes without the fix named by its fixed value, e.g.
  ``swa-fixes-lazy_merge`` runs eager_cat), so a
  gain can be attributed to one change;
- ``eic``: ``swa-fixes`` with ``prefix_ownership=eic_release_protected_prefix`` (the fork's EIC
  rule; only the reference backend expresses it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from replay.errors import KvtraceError

BACKENDS = ("sglang", "reference")
#: Largest pool, chunk or context size accepted: 2^28 token slots (a 2 GiB int64 free list; page
#: ids are int32 in the schema). Beyond it a replay would exhaust this machine's memory.
MAX_POOL_TOKENS = 1 << 28


class KnobError(KvtraceError, ValueError):
    """A bad knob name or value, a bad preset, or a value a backend cannot express."""


@dataclass(frozen=True)
class Knob:
    """One policy knob or size.

    Attributes:
        name: the knob's name (``--set name=value``).
        type: ``str``, ``int``, ``float`` or ``bool``.
        default: 0.5.23's value (``swa-fixes``) for policies; the default size otherwise.
        values: allowed values of an enumerated knob (empty: any value of ``type`` within
            ``min_value``).
        group: ``policy`` (compared by presets), ``size`` (pool and batch sizes, server
            arguments) or ``sim`` (replay-only settings: the virtual clock's step-cost model, the
            tree core).
        upstream: the upstream change or server argument the knob stands for.
        help: one line.
        refused: backend -> values that backend cannot express.
        min_value: smallest allowed number (numeric knobs).
        max_value: largest allowed number (pool sizes: what this machine's tensors can hold).
        plugin: the knob also accepts ``pkg.mod:Class`` import paths.
    """

    name: str
    type: type
    default: object
    help: str
    group: str = "policy"
    values: tuple = ()
    upstream: str = ""
    refused: dict = field(default_factory=dict)
    min_value: float | None = None
    max_value: float | None = None
    plugin: bool = False

    def parse(self, raw: object) -> object:
        """Coerce and validate one value (a ``--set`` string or a Python value)."""
        value = _coerce(self, raw)
        if self.values and value not in self.values and not (self.plugin and _is_import_path(value)):
            allowed = ", ".join(map(str, self.values)) + (", or pkg.mod:Class" if self.plugin else "")
            raise KnobError(f"{self.name}={raw!r}: expected one of {allowed}")
        if self.min_value is not None and value < self.min_value:
            raise KnobError(f"{self.name}={raw!r}: expected a number >= {self.min_value:g}")
        if self.max_value is not None and value > self.max_value:
            bound = int(self.max_value) if float(self.max_value).is_integer() else self.max_value
            raise KnobError(f"{self.name}={raw!r}: expected a number <= {bound:,}")
        return value

    def as_dict(self) -> dict:
        return {"name": self.name, "type": self.type.__name__, "group": self.group,
                "default": self.default, "values": list(self.values), "upstream": self.upstream,
                "help": self.help, "refused": {b: list(v) for b, v in self.refused.items()},
                "plugin": self.plugin}


def _is_import_path(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value) is not None


def _coerce(knob: Knob, raw: object) -> object:
    typ = knob.type
    if isinstance(raw, str):
        text = raw.strip()
        if typ is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise KnobError(f"{knob.name}={raw!r}: expected true or false")
        if typ is int:
            try:
                return int(text.replace("_", ""))
            except ValueError:
                raise KnobError(f"{knob.name}={raw!r}: expected an integer") from None
        if typ is float:
            try:
                value = float(text)
            except ValueError:
                raise KnobError(f"{knob.name}={raw!r}: expected a number") from None
            if not math.isfinite(value):
                raise KnobError(f"{knob.name}={raw!r}: expected a finite number")
            return value
        return text
    if typ is bool and isinstance(raw, bool):
        return raw
    if typ is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if typ is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if not math.isfinite(raw):
            raise KnobError(f"{knob.name}={raw!r}: expected a finite number")
        return float(raw)
    if typ is str and isinstance(raw, str):
        return raw
    raise KnobError(f"{knob.name}={raw!r}: expected {typ.__name__}")


KNOBS: tuple[Knob, ...] = (
    # ---- policies (DESIGN.md §5); the first listed value is the pre-fix one where there is one
    Knob("swa_lru_refresh", str, "window_aware", "which ancestors a match/insert moves to SWA MRU",
         values=("full_ancestry", "window_aware"), upstream="sgl-project/sglang#26615"),
    Knob("swa_admission", str, "shrink_never_fits",
         "an extend whose SWA need does not fit: wait, or shrink its chunk (always / only if it never fits)",
         values=("all_or_nothing", "shrink_always", "shrink_never_fits"),
         upstream="sgl-project/sglang#31681, gated in #32700"),
    Knob("host_free", str, "lazy_merge", "host (HiCache) free list: concatenate on every free, or merge lazily",
         values=("eager_cat", "lazy_merge"), upstream="sgl-project/sglang#30658"),
    Knob("swa_out_of_window_release", str, "decode_and_unfinished_insert",
         "free a running request's out-of-window SWA slots: never, in decode, or also at unfinished inserts",
         values=("off", "decode_only", "decode_and_unfinished_insert"),
         upstream="sgl-project/sglang#27402 (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS)"),
    Knob("swa_release_boundary", str, "max_window_page",
         "out-of-window release keeps W (pre-fix: W+ps cut to W) or ceil(max(W, ps)) to a page",
         values=("window_plus_page_cut_to_window", "max_window_page"), upstream="sgl-project/sglang#29860"),
    Knob("prefix_ownership", str, "radix_protected_floor",
         "who owns the protected prefix's SWA: the radix tree, or EIC (released below cache_protected_len)",
         values=("radix_protected_floor", "eic_release_protected_prefix"), upstream="fork EIC rule (#655/#710)",
         refused={"sglang": ("eic_release_protected_prefix",)}),
    Knob("eviction_policy", str, "lru", "FULL radix eviction strategy (SWA always uses its own LRU)",
         values=("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"), plugin=True,
         upstream="--radix-eviction-policy", refused={"reference": ("slru", "tlru")}),
    Knob("device_free", str, "prepend",
         "device free list: prepend freed pages (reuse first) or stage and sort-merge when short",
         values=("prepend", "sorted_merge"), upstream="allocator need_sort"),
    # ---- sizes (server arguments)
    Knob("page_size", int, 16, "tokens per KV page", group="size", min_value=1, max_value=4096, upstream="--page-size"),
    Knob("sliding_window_tokens", int, 128, "SWA window W; 0 = a full-attention-only model", group="size",
         min_value=0, max_value=MAX_POOL_TOKENS, upstream="model config sliding_window"),
    Knob("full_pool_tokens", int, 262144, "slots of the full device pool", group="size", min_value=1, max_value=MAX_POOL_TOKENS,
         upstream="--max-total-tokens"),
    Knob("swa_pool_tokens", int, 0, "slots of the SWA device pool; 0 = full_pool_tokens * swa_full_tokens_ratio",
         group="size", min_value=0, max_value=MAX_POOL_TOKENS, upstream="derived from --swa-full-tokens-ratio"),
    Knob("swa_full_tokens_ratio", float, 0.25, "SWA/full pool size ratio when swa_pool_tokens is 0",
         group="size", min_value=0.0, max_value=16.0, upstream="--swa-full-tokens-ratio"),
    Knob("chunked_prefill_size", int, 8192, "tokens per prefill chunk", group="size", min_value=1, max_value=MAX_POOL_TOKENS,
         upstream="--chunked-prefill-size"),
    Knob("max_prefill_tokens", int, 16384, "prefill token budget per step", group="size", min_value=1, max_value=MAX_POOL_TOKENS,
         upstream="--max-prefill-tokens"),
    Knob("max_running_requests", int, 64, "running batch cap", group="size", min_value=1, max_value=65536,
         upstream="--max-running-requests"),
    Knob("host_pool_tokens", int, 0, "HiCache host pool slots; 0 = no HiCache", group="size", min_value=0, max_value=MAX_POOL_TOKENS,
         upstream="--hicache-size / --hicache-ratio"),
    Knob("host_swa_pool_tokens", int, 0, "HiCache host SWA pool slots (kv_stack=dsv4); 0 = sized as the server "
         "sizes it from host_pool_tokens", group="size", min_value=0, max_value=MAX_POOL_TOKENS,
         upstream="--hicache-ratio (DSV4: _deepseek_v4_num_host_pages)"),
    Knob("kv_stack", str, "generic", "the memory stack: generic hybrid SWA pools, or DeepSeek-V4's "
         "(page 256, its HiCache host sizing and retraction)", group="size", values=("generic", "dsv4"),
         upstream="DeepseekV4ForCausalLM (DSV4PoolConfigurator)", refused={"sglang": ("dsv4",)}),
    Knob("hicache_write_policy", str, "write_through", "when the tree backs pages up to the host pool",
         group="size", values=("write_through", "write_through_selective", "write_back"),
         upstream="--hicache-write-policy"),
    # ---- replay-only settings
    Knob("schedule_policy", str, "fcfs", "waiting-queue order", group="sim",
         values=("fcfs", "lof", "random", "lpm", "dfs-weight"), upstream="--schedule-policy"),
    Knob("swa_eviction_interval_tokens", int, 128, "decode out-of-window release cadence", group="sim",
         min_value=1, max_value=MAX_POOL_TOKENS, upstream="SGLANG_SWA_EVICTION_INTERVAL"),
    Knob("tree_core", str, "auto", "radix tree core of the real backend; auto = rust, python when "
         "swa_lru_refresh=full_ancestry (the Rust core refreshes inside Rust)", group="sim",
         values=("auto", "rust", "python"), upstream="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"),
    Knob("scheduler", str, "real", "sglang backend control flow: sglang's own Scheduler (real) or the "
         "restated loop (mirror)", group="sim", values=("real", "mirror"), upstream="managers/scheduler.py"),
    Knob("max_context_tokens", int, 0, "request row width; 0 = derived from the workload", group="sim",
         min_value=0, max_value=MAX_POOL_TOKENS, upstream="--context-length"),
    Knob("decode_coalescing", str, "auto", "reference backend: run quiet decode stretches in one move (exact: "
         "the same rows as step by step; replay.backends.reference.coalesce); auto = on for the reference "
         "backend (the real backends step their own loop)", group="sim", values=("auto", "off", "on"),
         upstream="issue 26", refused={"sglang": ("on",)}),
    Knob("stop_on_retraction", str, "off", "reference backend: end the run at its first retraction or abort "
         "(the run is the same up to there; kvtrace plan uses it to drop a split that cannot serve the trace "
         "without retracting; the summary's stopped says so)", group="sim", values=("off", "on"),
         upstream="issue 26", refused={"sglang": ("on",)}),
    Knob("step_fixed_ns", int, 5_000_000, "virtual-clock cost of one forward step", group="sim", min_value=0),
    Knob("step_per_token_ns", int, 20_000, "virtual-clock cost per token run in a step", group="sim",
         min_value=0),
)

KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}

#: DESIGN.md §5 spells the at-insert release as its own switch; it is the third value of
#: ``swa_out_of_window_release``. ``--set swa_free_out_of_window_at_insert=true|false`` is taken.
ALIASES = {"swa_free_out_of_window_at_insert": ("swa_out_of_window_release",
                                               {True: "decode_and_unfinished_insert", False: "decode_only"})}

#: The fixes between ``baseline`` and ``swa-fixes``: knob -> (pre-fix value, fixed value).
FIXES: dict[str, tuple[str, str]] = {
    "swa_lru_refresh": ("full_ancestry", "window_aware"),
    "swa_admission": ("all_or_nothing", "shrink_never_fits"),
    "host_free": ("eager_cat", "lazy_merge"),
    "swa_out_of_window_release": ("decode_only", "decode_and_unfinished_insert"),
    "swa_release_boundary": ("window_plus_page_cut_to_window", "max_window_page"),
}


#: Where bytedance-iaas/sglang#659 (the DeepSeek-V4 fork) differs from ``swa-fixes`` (docs/claims.md).
FORK_659: dict[str, str] = {"swa_admission": "shrink_always", "swa_out_of_window_release": "decode_only"}


def _build_presets() -> dict[str, dict[str, object]]:
    fixed = {k: v[1] for k, v in FIXES.items()} | {"prefix_ownership": "radix_protected_floor"}
    baseline = {k: v[0] for k, v in FIXES.items()} | {"prefix_ownership": "radix_protected_floor"}
    presets: dict[str, dict[str, object]] = {"recorded": {}, "baseline": baseline, "swa-fixes": fixed}
    for knob, (pre, post) in FIXES.items():
        presets[f"baseline+{post}"] = baseline | {knob: post}
        presets[f"swa-fixes-{post}"] = fixed | {knob: pre}
    presets["eic"] = fixed | {"prefix_ownership": "eic_release_protected_prefix"}
    presets["fork-659"] = fixed | FORK_659
    return presets


PRESETS: dict[str, dict[str, object]] = _build_presets()

PRESET_HELP = {
    "recorded": "the settings in the trace's manifest (missing ones take the defaults; the run lists them)",
    "baseline": "every pre-fix behaviour: " + ", ".join(f"{k}={v[0]}" for k, v in FIXES.items()),
    "swa-fixes": "sglang 0.5.23 (not #659: see fork-659): " + ", ".join(f"{k}={v[1]}" for k, v in FIXES.items()),
    "fork-659": "bytedance-iaas/sglang#659 as its post659 code does it: swa-fixes with "
                + ", ".join(f"{k}={v}" for k, v in FORK_659.items()),
    "eic": "swa-fixes with prefix_ownership=eic_release_protected_prefix (reference backend only)",
}


def knob(name: str) -> Knob:
    """The knob called ``name``; raises :class:`KnobError` listing the valid names."""
    try:
        return KNOB_BY_NAME[name]
    except KeyError:
        raise KnobError(f"unknown knob {name!r}; valid knobs: {', '.join(KNOB_BY_NAME)}") from None


def values_of(name: str) -> tuple:
    """Allowed values of an enumerated knob (what backend configs validate against)."""
    return knob(name).values


def defaults() -> dict[str, object]:
    """Every knob's default (sglang 0.5.23's behaviour)."""
    return {k.name: k.default for k in KNOBS}


def parse_sets(items) -> dict[str, object]:
    """Parse ``key=value`` strings (``--set``) into knob values.

    Raises:
        KnobError: malformed item, unknown name (lists the valid ones) or bad value (lists the
            allowed ones).
    """
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise KnobError(f"--set {item!r}: expected key=value")
        if key in ALIASES:
            target, mapping = ALIASES[key]
            out[target] = mapping[_coerce(Knob(key, bool, False, ""), raw)]
            continue
        out[key] = knob(key).parse(raw)
    return out


def preset(name: str) -> dict[str, object]:
    """The knob values of preset ``name``; raises :class:`KnobError` listing the known presets."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise KnobError(f"unknown policy {name!r}; known presets: {', '.join(PRESETS)}") from None


def check_backend(values: dict[str, object], backend: str) -> None:
    """Refuse values ``backend`` cannot express, naming the knob and a backend that can."""
    if backend not in BACKENDS:
        raise KnobError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    for name, value in values.items():
        k = KNOB_BY_NAME.get(name)
        if k is None:
            continue
        refused = k.refused.get(backend, ())
        plugin_refused = backend == "sglang" and k.plugin and isinstance(value, str) and value not in k.values
        if value in refused or plugin_refused:
            able = [b for b in BACKENDS if b != backend and value not in k.refused.get(b, ())]
            raise KnobError(f"{name}={value} cannot be expressed by the {backend} backend; "
                            f"use --backend {' or '.join(able) or '(none)'}")


def resolve(policy: str, sets=(), recorded: dict | None = None) -> tuple[dict[str, object], list[str]]:
    """Resolve a preset plus ``--set`` overrides over the recorded (or default) settings.

    Args:
        policy: preset name.
        sets: ``key=value`` strings or a dict of knob values (applied last).
        recorded: knob values read from a trace's manifest (``recorded_settings``); the base of
            every preset, so sizes stay the trace's unless overridden.
    Returns:
        (every knob's value, names whose value was assumed: neither recorded, preset nor set).
    """
    base = defaults()
    recorded = dict(recorded or {})
    chosen = preset(policy)
    overrides = dict(sets) if isinstance(sets, dict) else parse_sets(sets)
    for name, v in list(overrides.items()):
        overrides[name] = knob(name).parse(v)
    values = base | recorded | chosen | overrides
    assumed = [n for n in base if n not in recorded and n not in chosen and n not in overrides
               and KNOB_BY_NAME[n].group != "sim"]
    return values, assumed


#: manifest ``server`` key -> knob name, for :func:`recorded_settings`.
_SERVER_TO_KNOB = {
    "page_size": "page_size", "sliding_window_tokens": "sliding_window_tokens",
    "full_pool_tokens": "full_pool_tokens", "swa_pool_tokens": "swa_pool_tokens",
    "swa_full_tokens_ratio": "swa_full_tokens_ratio", "chunked_prefill_size": "chunked_prefill_size",
    "max_prefill_tokens": "max_prefill_tokens", "max_running_requests": "max_running_requests",
    "host_pool_tokens": "host_pool_tokens", "hicache_write_policy": "hicache_write_policy",
    "eviction_policy": "eviction_policy", "schedule_policy": "schedule_policy",
}


def recorded_settings(manifest: dict) -> dict[str, object]:
    """Knob values a trace's manifest records (``server`` block, then ``settings`` of a run).

    Values that do not parse are ignored (they then count as assumed). A run's manifest holds
    every knob under ``run.settings``, so replaying a run under ``recorded`` repeats it.
    """
    out: dict[str, object] = {}
    server = manifest.get("server") or {}
    for key, name in _SERVER_TO_KNOB.items():
        raw = server.get(key)
        if raw in (None, ""):
            continue
        try:
            out[name] = knob(name).parse(raw)
        except KnobError:
            continue
    if out.get("host_pool_tokens", 0) == 0:
        out.pop("hicache_write_policy", None)
    run = (manifest.get("run") or {}).get("settings") or {}
    for name, raw in run.items():
        if name in KNOB_BY_NAME:
            try:
                out[name] = knob(name).parse(raw)
            except KnobError:
                continue
    return out


__all__ = ["ALIASES", "BACKENDS", "FIXES", "FORK_659", "KNOBS", "KNOB_BY_NAME", "Knob", "KnobError", "PRESETS",
           "PRESET_HELP", "check_backend", "defaults", "knob", "parse_sets", "preset", "recorded_settings",
           "resolve", "values_of"]
