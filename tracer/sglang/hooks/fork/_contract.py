"""``contracts(...)``: the fork hook modules' ``CONTRACTS`` built as ``tracer.sglang.targets``'
``Contract`` objects (B's table), keeping only the fields that class has, so a module still
imports while that table is being written. Standard library only; nothing on the hot path."""

from __future__ import annotations

import dataclasses


def contracts(module: str, *specs: dict) -> tuple:
    """One ``Contract`` per spec (``hook``, ``cls``, ``method``, ``params``, ``reads``,
    ``levels``, ``optional``, ``pools``; ``module`` is the default module). Returns the specs
    themselves (dicts) when the ``Contract`` class is not importable."""
    try:
        from tracer.sglang.targets.contract import Contract
    except ImportError:  # (the targets table is not there yet)
        return tuple({"module": module, **s} for s in specs)
    names = {f.name for f in dataclasses.fields(Contract)}
    out = []
    for s in specs:
        kw = {"module": module, **s}
        if "reads" in kw:
            kw["reads"] = tuple(kw["reads"])
        if "pools" in kw:
            kw["pools"] = tuple(kw["pools"])
        out.append(Contract(**{k: v for k, v in kw.items() if k in names}))
    return tuple(out)
