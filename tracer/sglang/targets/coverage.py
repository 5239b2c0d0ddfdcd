"""Coverage: each canonical hook's state in this process and, per pool, whether its occupancy is
fully accounted. Computed at install (never on the hot path) and recorded in each rank file
(``coverage``) and by ``kvtrace hooks check``.

A hook's state combines its contracts (those not ``skipped`` at the level):
``installed`` (every required one wrapped), ``mismatch`` (one is present with other parameters
or attributes, or only some are there; with the reason), ``absent`` (none is in the code, or no
hook module of the target implements it), ``unused`` (their module was not imported in this
process), ``skipped`` (the level does not install it, or the target has no counterpart).

The coverage state: ``full`` (every hook that applies is installed or unused), ``none`` (no hook
installed), else ``partial``. A trace's end state follows it: ``complete``, ``uncovered``,
``partial`` (``TRACE_STATE``).
"""

from __future__ import annotations

from tracer.sglang.targets.contract import (ABSENT, INSTALLED, MISMATCH, ROW_LEVELS, SKIPPED,
                                            UNUSED, Check, Contract, check)
from tracer.sglang.targets.table import HOOKS

FULL, PARTIAL, NONE = "full", "partial", "none"
TRACE_STATE = {FULL: "complete", PARTIAL: "partial", NONE: "uncovered"}


def contracts_of(modules) -> list[Contract]:
    """The ``CONTRACTS`` of hook modules (objects with that attribute)."""
    out: list[Contract] = []
    for m in modules:
        out.extend(getattr(m, "CONTRACTS", ()))
    return out


def _combine(checks: list[Check]) -> tuple[str, str]:
    live = [c for c in checks if c.state != SKIPPED]
    if not live:
        return SKIPPED, checks[0].reason if checks else ""
    req = [c for c in live if not c.contract.optional]
    mism = [c for c in live if c.state == MISMATCH]
    if mism:
        return MISMATCH, "; ".join(c.reason for c in mism)
    states = {c.state for c in req}
    if not req or states <= {INSTALLED}:
        return INSTALLED, ""
    if states <= {UNUSED}:
        return UNUSED, req[0].reason
    if states <= {UNUSED, INSTALLED}:
        return INSTALLED, ""  # (a module of the hook not imported yet: wrapped when it is)
    absent = [c for c in req if c.state == ABSENT]
    if len(absent) == len([c for c in req if c.state != UNUSED]):
        return ABSENT, "; ".join(c.reason for c in absent)
    return MISMATCH, "partly: " + "; ".join(c.reason for c in absent)


def hook_states(contracts: list[Contract], level: str, is_patched, *,
                target=None, installing: bool = True) -> dict[str, dict]:
    """{hook: {"state", "reason"}} over every canonical hook (and any other a contract names).

    Args:
        contracts: the target's hook modules' contracts.
        level: the capture level.
        is_patched: the patcher's ``is_patched`` (None: only check the contracts).
        target: the target (its ``not_applicable`` hooks are ``skipped``), or None.
        installing: a hook with no contract is ``absent`` ("no hook module implements it").
    """
    by_hook: dict[str, list[Check]] = {}
    for c in contracts:
        by_hook.setdefault(c.hook, []).append(check(c, level, is_patched))
    na = set(getattr(target, "not_applicable", ()) or ())
    out = {}
    for name in list(HOOKS) + [h for h in by_hook if h not in HOOKS]:
        if name in na:
            out[name] = {"state": SKIPPED, "reason": f"no counterpart in {target.name}"}
        elif name not in by_hook:
            who = f"target {target.name}" if target is not None else "this code"
            out[name] = {"state": ABSENT, "reason": f"no hook module of {who} implements it"}
        else:
            s, why = _combine(by_hook[name])
            out[name] = {"state": s, "reason": why}
    return out


def pool_states(hooks: dict[str, dict], level: str) -> dict[str, dict]:
    """{pool: {"accounted", "reason"}}: a pool's occupancy is fully accounted when the level
    writes pool rows and every hook its rows depend on is installed (or unused)."""
    pools: dict[str, list[str]] = {}
    for h in HOOKS.values():
        for p in h.pools:
            pools.setdefault(p, []).append(h.name)
    out = {}
    for p, names in pools.items():
        if level not in ROW_LEVELS:
            out[p] = {"accounted": False, "reason": f"level {level} writes no pool rows"}
            continue
        bad = [f"{n} {hooks[n]['state']}" for n in names
               if hooks.get(n, {}).get("state") not in (INSTALLED, UNUSED, SKIPPED)]
        out[p] = {"accounted": not bad, "reason": "; ".join(bad)}
    return out


def state_of(hooks: dict[str, dict]) -> str:
    """``full`` | ``partial`` | ``none`` (see the module docstring)."""
    live = [h["state"] for h in hooks.values() if h["state"] != SKIPPED]
    if not any(s == INSTALLED for s in live):
        return NONE
    return FULL if all(s in (INSTALLED, UNUSED) for s in live) else PARTIAL


def coverage(detection, contracts: list[Contract], level: str, is_patched, *,
             partial: bool = False) -> dict:
    """The JSON object recorded as a rank file's ``coverage`` (docs/schema.md)."""
    hooks = hook_states(contracts, level, is_patched, target=detection.target)
    state = state_of(hooks)
    if detection.target is None and state == FULL:
        state = PARTIAL  # no known target: whatever matched, it was not tested as a whole
    out = detection.as_dict()
    out.update(level=level, state=state, trace_state=TRACE_STATE[state], partial=partial,
               hooks=hooks, pools=pool_states(hooks, level))
    return out
