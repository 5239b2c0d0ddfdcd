"""The repeated wrapper shapes of the hooks, written once.

Each helper returns a wrapper *factory* (``make(original) -> wrapper``) for
``Patcher.wrap_method``/``wrap_function``. They forward ``*args, **kwargs``: on CPython 3.11
such a call costs several times an exact-parameter call, so hooks on the scheduler's hot paths
(run several times per step: allocator leaves, ``match_prefix``, ``lock``/``unlock``,
admission, ``prepare_for_*``, the step boundary) are written by hand with the exact parameters
of the method they wrap (``patching.exact_only``). ``bench/sglang_overhead.py --breakdown``
shows the per-call cost that justifies each of those; everything that runs once per object,
per request or off the step path uses a helper here.

Every helper swallows errors of the hook's own work (``state.note_failure``) and lets the
original's exceptions through unchanged.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.sglang.runtime.state import NOOP, note_failure


def after_init(site: str, fn):
    """``__init__`` wrapper: run the original, then ``fn(self)`` (register the new object)."""

    def make(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                fn(self)
            except Exception as e:
                note_failure(site, e)

        return __init__

    return make


def before_init(site: str, fn):
    """``__init__`` wrapper: ``fn(self, args, kwargs)`` first, then the original."""

    def make(orig):
        def __init__(self, *args, **kwargs):
            try:
                fn(self, args, kwargs)
            except Exception as e:
                note_failure(site, e)
            return orig(self, *args, **kwargs)

        return __init__

    return make


def after_call(site: str, fn):
    """Method wrapper: run the original, then ``fn(self)`` whether recording or not."""

    def make(orig):
        def wrapper(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            try:
                fn(self)
            except Exception as e:
                note_failure(site, e)
            return out

        return wrapper

    return make


def timed(site: str, account):
    """Method wrapper: while recording, time the original and call
    ``account(self, out, dur_ns, args, kwargs)`` (which writes the row); else just run it."""

    def make(orig):
        def wrapper(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            try:
                account(self, out, perf_counter_ns() - t0, args, kwargs)
            except Exception as e:
                note_failure(site, e)
            return out

        return wrapper

    return make


def timed_before(site: str, before, account):
    """Like :func:`timed`, with ``pre = before(self, args, kwargs)`` read first and passed on as
    ``account(self, pre, dur_ns, args, kwargs)`` (sizes before an op, e.g. a staged count)."""

    def make(orig):
        def wrapper(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            try:
                pre = before(self, args, kwargs)
            except Exception:
                pre = None
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            if pre is not None:
                try:
                    account(self, pre, perf_counter_ns() - t0, args, kwargs)
                except Exception as e:
                    note_failure(site, e)
            return out

        return wrapper

    return make


def run_measured(obj, orig, args, kwargs, account, site: str):
    """Run ``orig(obj, *args, **kwargs)`` once under the re-entrancy flag (nested wrapped calls
    are then not counted again), then ``account(dur_ns, out)``; an error there is counted under
    ``site``, never raised. Returns what ``orig`` returned (its exceptions propagate)."""
    d = obj.__dict__
    d["_kvt_busy"] = True
    out = None
    t0 = perf_counter_ns()
    try:
        out = orig(obj, *args, **kwargs)
        return out
    finally:
        dur = perf_counter_ns() - t0
        d["_kvt_busy"] = False
        try:
            account(dur, out)
        except Exception as e:
            note_failure(site, e)
