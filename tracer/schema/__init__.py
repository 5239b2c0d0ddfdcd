"""Trace schema v1: the contract between the tracer, the replayer and the notebooks.

A trace is a directory::

    TRACE/
      manifest.json                         # MANIFEST_KEYS below
      ranks/rank=<r>.json                   # one per recording process (pid, anchors, options)
      <family>/rank=<r>/part-<n>.parquet    # closed segments
      <family>/rank=<r>/part-<n>.arrows     # open segment (Arrow IPC stream; `kvtrace recover`)

Every row carries ``ts_ns`` (monotonic ns since the trace's clock anchor) and ``seq`` (strictly
increasing per rank across all families: the total order). ``rank`` comes from the partition.

Enum columns are stored as ``uint8`` codes while recording and as dictionary-encoded strings in
Parquet, so analysts can write ``WHERE pool = 'swa'``. The code order below is part of the contract:
append new members only (a minor version bump); never renumber.

Adding a column is a minor bump; renaming or retyping one is a major bump. Readers refuse an
unknown major version.

The package is the whole on-disk contract: this module (families, columns, enums, manifest
keys), ``tracer.schema.manifest`` (manifest and rank files) and ``tracer.schema.storage``
(segment layout, Parquet encoding, IPC stream recovery). ``replay`` imports from ``tracer`` only
this package. It imports only the standard library and pyarrow (it runs inside the server).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1.3"
SCHEMA_MAJOR = int(SCHEMA_VERSION.split(".")[0])
PRODUCER = "kvtrace"


# --------------------------------------------------------------------------------------------
# Enums (uint8 codes on the hot path; names are the strings stored in Parquet)
# --------------------------------------------------------------------------------------------
class Pool(enum.IntEnum):
    """Which memory pool an allocator op or a stats row is about."""

    FULL = 0  # device pool of full-attention layers
    SWA = 1  # device pool of sliding-window layers
    HOST_FULL = 2  # HiCache host copy of the full pool
    HOST_SWA = 3  # HiCache host copy of the SWA pool
    REQ_TO_TOKEN = 4  # request rows (req_to_token_pool); counts requests, not tokens


class PoolOp(enum.IntEnum):
    """Allocator op. Only ALLOC and FREE change occupancy; the rest are markers."""

    ALLOC = 0
    FREE = 1
    FREE_GROUP_BEGIN = 2
    FREE_GROUP_END = 3
    MERGE = 4  # staged/released slots merged into the free list (host lazy merge, need_sort)
    ALLOC_FAIL = 5  # an allocation that returned None (num_slots = what was asked)
    CLEAR = 6  # marker after a pool reset; its slots are counted by the free row just before it


class CacheOp(enum.IntEnum):
    """Prefix-cache (radix tree) operation."""

    MATCH = 0
    INSERT = 1  # insert/checkpoint of a request's KV into the tree
    EVICT = 2  # device eviction (delete, demote to host, or SWA tombstone)
    LOCK = 3
    UNLOCK = 4
    LOAD_BACK = 5  # host -> device (HiCache)
    BACKUP = 6  # device -> host (HiCache write-through / write-back)
    HOST_EVICT = 7  # host eviction
    SWA_RELEASE = 8  # out-of-window SWA slots of a running request freed
    RELEASE = 9  # release_kv_cache of a finished/retracted request


class SchedKind(enum.IntEnum):
    STEP = 0  # one scheduling step (batch formed and run)
    ADMIT = 1  # one prefill admission decision
    RETRACT = 2  # a running request retracted for decode memory


class Mode(enum.IntEnum):
    IDLE = 0
    PREFILL = 1
    DECODE = 2
    MIXED = 3


class Verdict(enum.IntEnum):
    """Admission verdict of one request in one step."""

    NONE = 0  # not an admission row
    ADMITTED = 1  # whole extend admitted
    CHUNKED = 2  # admitted as a chunk (chunk_admitted < chunk_requested)
    SHRUNK = 3  # chunk cut under SWA pressure
    NO_TOKEN = 4  # total-token budget exhausted
    SWA_WAIT = 5  # SWA budget would not fit: waits (all-or-nothing)
    OTHER = 6  # other stop (chunk budget, batch limit, ...)


class RequestEvent(enum.IntEnum):
    ARRIVAL = 0
    FINISH = 1
    ABORT = 2


class DropReason(enum.IntEnum):
    BUFFER_FULL = 0  # emits arrived faster than the flusher drained
    WRITE_ERROR = 1  # the sink failed (disk full, directory removed); recorder disabled
    TORN = 2  # a reserved record was never completed before a flush
    STOPPED = 3  # emits lost at stop/exit (flush failed or timed out)


ENUMS: dict[str, type[enum.IntEnum]] = {
    "pool": Pool,
    "op": PoolOp,  # in family "pool"; "cache" uses CacheOp under the same column name
    "mode": Mode,
    "verdict": Verdict,
    "event": RequestEvent,
    "kind": SchedKind,
    "reason": DropReason,
}


def enum_names(e: type[enum.IntEnum]) -> list[str]:
    """Stored dictionary of an enum: lowercase member names in code order."""
    return [m.name.lower() for m in sorted(e, key=int)]


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Column:
    """One column: ``code`` is the struct code used on the hot path ('' = not in the record).

    ``default``: for a column added in a minor version, the value rows of older files (which
    lack the column) are read as; None: every file of the family has the column."""

    name: str
    type: pa.DataType
    doc: str
    code: str = ""
    enum: type[enum.IntEnum] | None = None
    default: object = None


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def record_format(self) -> str:
        """Little-endian, unpadded struct format of the fixed-size hot-path record."""
        return "<" + "".join(c.code for c in self.columns if c.code)

    def arrow_schema(self, *, stored: bool = True) -> pa.Schema:
        """Arrow schema. ``stored=True``: enums as dictionary strings (Parquet); else raw codes."""
        fields = []
        for c in self.columns:
            t = c.type
            if c.enum is not None and stored:
                t = pa.dictionary(pa.int8(), pa.string())
            fields.append(pa.field(c.name, t))
        meta = {b"kvtrace.schema_version": SCHEMA_VERSION.encode(), b"kvtrace.family": self.name.encode()}
        return pa.schema(fields, metadata=meta)


def _c(name, typ, doc, code="", enum_=None, default=None) -> Column:
    return Column(name, typ, doc, code, enum_, default)


I64, I32, U8, U64 = pa.int64(), pa.int32(), pa.uint8(), pa.uint64()
_TS = _c("ts_ns", I64, "Monotonic ns since the trace's clock anchor (manifest `clock`).", "q")
_SEQ = _c("seq", I64, "Per-rank sequence number, strictly increasing across all families.", "q")

REQUEST = Family(
    "request",
    "One row per request arrival, finish or abort. A workload is a trace holding only this family.",
    (
        _TS,
        _SEQ,
        _c("event", U8, "arrival | finish | abort.", "B", RequestEvent),
        _c("rid", I64, "Request number (the tracer maps server request ids to numbers).", "q"),
        _c("session_id", I64, "Conversation/session number; -1 when unknown.", "q"),
        _c("turn", I32, "Turn index within the session (0-based); -1 when unknown.", "i"),
        _c("input_len", I32, "Prompt tokens.", "i"),
        _c("output_len", I32, "Generated tokens (at finish: actual; at arrival: planned or -1).", "i"),
        _c("max_new_tokens", I32, "Requested generation cap.", "i"),
        _c("cached_len", I32, "Prompt tokens served from cache (finish rows; -1 when unknown).", "i"),
        _c("rid_str", pa.string(), "Server request id as a string ('' when none)."),
        _c(
            "page_hashes",
            pa.list_(U64),
            "Chained hash per hash block of the prompt (manifest `hash_block_tokens`); on disk "
            "only the blocks after the `prefix_blocks` shared with request `prefix_rid`.",
        ),
        _c("prefix_rid", I64, "Earlier request whose chain this prompt extends; -1 none (since 1.1).",
           "q", default=-1),
        _c("prefix_blocks", I32, "Leading hashes equal to `prefix_rid`'s, not stored again (since 1.1).",
           "i", default=0),
        _c("new_blocks", I32, "Compacted traces: blocks after `prefix_blocks`, not stored (readers "
           "synthesize them from their position); -1: they are in `page_hashes` (since 1.2).",
           "i", default=-1),
        _c("tip_hash", U64, "Compacted traces: the original chain hash of the prompt's last block, to "
           "compare prompts across traces; 0 otherwise (since 1.2).", "Q", default=0),
    ),
)

SCHED = Family(
    "sched",
    "One row per scheduling step, per prefill admission decision, and per retraction.",
    (
        _TS,
        _SEQ,
        _c("kind", U8, "step | admit | retract.", "B", SchedKind),
        _c("forward_ct", I64, "Scheduler forward counter (step number).", "q"),
        _c("mode", U8, "idle | prefill | decode | mixed (step rows).", "B", Mode),
        _c("batch_size", I32, "Requests in the batch (step rows).", "i"),
        _c("num_tokens", I32, "Tokens run in the step (step rows).", "i"),
        _c("step_ns", I64, "Scheduler CPU wall time of the step (step rows).", "q"),
        _c("rid", I64, "Request (admit/retract rows); -1 on step rows.", "q"),
        _c("prefix_len", I32, "Matched prefix tokens (admit rows).", "i"),
        _c("extend_len", I32, "Tokens to compute (admit rows).", "i"),
        _c("host_hit_len", I32, "Prefix tokens to load back from host (admit rows).", "i"),
        _c("chunk_requested", I32, "Tokens the request asked to prefill in this step.", "i"),
        _c("chunk_admitted", I32, "Tokens admitted (0 when rejected).", "i"),
        _c("verdict", U8, "Admission verdict (admit rows).", "B", Verdict),
        _c("rem_total", I64, "Remaining total-token budget after the decision.", "q"),
        _c("rem_swa", I64, "Remaining SWA-token budget after the decision (-1: no SWA).", "q"),
        _c("swa_needed", I64, "SWA tokens the request needed (admit rows; -1: no SWA).", "q"),
    ),
)

CACHE = Family(
    "cache",
    "One row per prefix-cache operation.",
    (
        _TS,
        _SEQ,
        _c("op", U8, "Cache operation.", "B", CacheOp),
        _c("rid", I64, "Request; -1 when the op is not on behalf of a request.", "q"),
        _c("device_hit", I32, "match: prefix tokens usable on device.", "i"),
        _c("host_hit", I32, "match: further prefix tokens held only on host.", "i"),
        _c("swa_host_hit", I32, "match: SWA window tokens to restore from host.", "i"),
        _c("full_tokens", I32, "Full-pool tokens the op touched (evicted, inserted, locked...).", "i"),
        _c("swa_tokens", I32, "SWA-pool tokens the op touched.", "i"),
        _c("host_tokens", I32, "Host-pool tokens the op touched.", "i"),
        _c("nodes", I32, "Tree nodes touched.", "i"),
        _c("tombstones", I32, "SWA tombstones created (evict) or crossed (match).", "i"),
        _c("dur_ns", I64, "CPU time of the op; 0 when not measured.", "q"),
    ),
)

POOL = Family(
    "pool",
    "One row per allocator op. Per pool, sum(alloc.num_slots) - sum(free.num_slots) is the used size.",
    (
        _TS,
        _SEQ,
        _c("pool", U8, "Pool.", "B", Pool),
        _c("op", U8, "alloc | free are occupancy changes; other ops are markers.", "B", PoolOp),
        _c("rid", I64, "Request; -1 when unknown or shared (e.g. tree eviction).", "q"),
        _c("num_slots", I32, "Slots (tokens) allocated or freed.", "i"),
        _c("num_pages", I32, "Pages allocated or freed (= num_slots at page_size 1).", "i"),
        _c("dur_ns", I64, "CPU time of the op; 0 when not measured.", "q"),
        _c("page_ids", pa.list_(I32), "Page ids, only at detail=pages (else null)."),
    ),
)

STATS = Family(
    "stats",
    "Sampled pool state, one row per pool per sample. available+evictable+protected+held=capacity.",
    (
        _TS,
        _SEQ,
        _c("forward_ct", I64, "Scheduler forward counter at the sample.", "q"),
        _c("pool", U8, "Pool.", "B", Pool),
        _c("capacity", I64, "Slots in the pool.", "q"),
        _c("available", I64, "Free slots (host: free + released-but-unmerged).", "q"),
        _c("evictable", I64, "Cached, unlocked slots.", "q"),
        _c("protected", I64, "Cached, locked slots.", "q"),
        _c("held", I64, "Request-private slots (not in the tree).", "q"),
    ),
)

DROPS = Family(
    "drops",
    "One row per gap in the recording.",
    (
        _TS,
        _SEQ,
        _c("family", pa.string(), "Family whose events were lost ('' = several/unknown)."),
        _c("first_seq", I64, "First lost seq (-1 when unknown).", "q"),
        _c("last_seq", I64, "Last lost seq (-1 when unknown).", "q"),
        _c("num_events", I64, "Events lost.", "q"),
        _c("reason", U8, "Why.", "B", DropReason),
        _c("detail", pa.string(), "Free text (error message)."),
    ),
)

FAMILIES: dict[str, Family] = {f.name: f for f in (REQUEST, SCHED, CACHE, POOL, STATS, DROPS)}
# Hot-path storage: fixed-size struct records (columns without a code, e.g. pool.page_ids, are
# side data) vs. rows kept as tuples (low-rate families with variable-length columns).
STRUCT_FAMILIES = ("pool", "cache", "sched", "stats")
ROW_FAMILIES = ("request", "drops")


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown trace family {name!r}; known: {', '.join(FAMILIES)}") from None


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------
MANIFEST_FILE = "manifest.json"

MANIFEST_KEYS: dict[str, str] = {
    "schema_version": "Schema version of every file in the trace ('1.3'; '1.0' to '1.2' still read).",
    "producer": "{'name': 'kvtrace', 'version': ..., 'source': 'tracer'|'workload'|'sglang-hooks'|...}.",
    "created_unix_ns": "Wall-clock time the trace was created.",
    "clock": "{'monotonic_ns': M, 'unix_ns': U}: ts_ns = monotonic_ns - M; unix = U + ts_ns.",
    "hash_block_tokens": "Tokens per page hash in request.page_hashes.",
    "page_hash": (
        "Name of the page-hash function of request.page_hashes ('kvtrace-chain-v1', "
        "tracer/schema/hashing.py); absent in older traces: read as 'kvtrace-legacy'."
    ),
    "server": (
        "Server config: page_size, sliding_window_tokens, full_pool_tokens, swa_pool_tokens, "
        "swa_full_tokens_ratio, chunked_prefill_size, cache_kind, host_pool_tokens, "
        "hicache_write_policy, max_running_requests, eviction_policy, model, sglang_version."
    ),
    "env": "Relevant environment flags (SGLANG_*), as strings.",
    "ranks": "List of ranks recorded (also ranks/rank=<r>.json per process).",
    "options": "Recorder options (buffer sizes, flush interval, detail).",
    "workload": "Workload generator/import parameters (workload traces only).",
    "chain_storage": (
        "How request chains are stored: 'hashes' (also when absent: the new blocks' hashes) or "
        "'positions' (`kvtrace compact`: a count of new blocks; readers synthesize their values "
        "with the salt in each request file's metadata, kvtrace.chain_salt)."
    ),
}

SERVER_KEYS = (
    "page_size",
    "sliding_window_tokens",
    "full_pool_tokens",
    "swa_pool_tokens",
    "swa_full_tokens_ratio",
    "chunked_prefill_size",
    "cache_kind",
    "host_pool_tokens",
    "hicache_write_policy",
    "max_running_requests",
    "eviction_policy",
    "model",
    "sglang_version",
)


class SchemaError(ValueError):
    """The on-disk contract is broken (manifest, rank file, column types, family names); the
    message names the file and what was expected. The offline CLI prints it as one line."""


def parse_major(version: str) -> int:
    """Major number of a schema version string; ValueError when malformed."""
    head = str(version).split(".")[0]
    if not head.isdigit():
        raise ValueError(f"malformed schema_version {version!r} (expected 'MAJOR.MINOR')")
    return int(head)
