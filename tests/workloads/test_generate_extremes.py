"""No generator input hangs: every generator option and every shape parameter of every shape,
driven over extreme values deterministically (no Hypothesis draw), each either refused with a
WorkloadError or generating within a few seconds (the per-test timeout fails a hang).

Found this way: ``--arrival gamma --cv 1e6`` ran for minutes (Gamma shape 1e-12: gaps are 0.0,
the planner's clock stood still and its loop had no bound but the clock).
"""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from replay.workloads.errors import WorkloadError
from replay.workloads.generate import MAX_ARRIVAL_CV, MIN_ARRIVAL_CV, GenerateOptions, generate
from replay.workloads.shapes import SHAPES, make_config

FLOAT_EXTREMES = ("0", "-0", "1e-300", "5e-324", "1", "1e12", "1e300", "inf", "-inf", "nan", "-1")
INT_EXTREMES = ("0", "1", "2", "-1", "65536", str(2**31 - 1), str(2**31), str(2**63))
N = 3


def _drive(options: GenerateOptions, config=None):
    """Generate or be refused; anything else (another exception, a hang) fails the test."""
    try:
        cols, _ = generate(options, config)
    except WorkloadError as e:
        assert str(e) and "Traceback" not in str(e)
        return None
    assert len(cols.ts_ns) == options.num_requests
    return cols


@pytest.mark.timeout(20)
@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
@pytest.mark.parametrize("cold", [False, True])
@pytest.mark.parametrize("value", FLOAT_EXTREMES + ("0.001", "0.000999", "100", "100.0001", "1e6"))
@pytest.mark.parametrize("opt", ["qps", "arrival_cv"])
def test_rate_options_at_extremes(opt, value, cold, arrival):
    v = float(value)
    opts = GenerateOptions("multi_turn", N, seed=1, arrival=arrival, warm_start=not cold, **{opt: v})
    cols = _drive(opts)
    if opt == "arrival_cv" and not (math.isfinite(v) and MIN_ARRIVAL_CV <= v <= MAX_ARRIVAL_CV):
        assert cols is None
    if opt == "qps" and not (math.isfinite(v) and v > 0):
        assert cols is None


@pytest.mark.timeout(20)
@pytest.mark.parametrize("value", ["1", "100", "100000000", "100000001"])
def test_request_count_at_extremes(value):
    n = int(value)
    if n > 1000:  # the large ones must be refused up front (or by the unit budget), not planned
        with pytest.raises(WorkloadError):
            generate(GenerateOptions("multi_turn", n, seed=1, qps=1e-9))
        return
    _drive(GenerateOptions("shared_prefix", n, seed=1))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("cv", [50.0, MAX_ARRIVAL_CV])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bursty_gamma_on_every_shape_ends(shape, cv):
    _drive(GenerateOptions(shape, 20, seed=3, arrival="gamma", arrival_cv=cv))


def _shape_cases():
    for name, shape in SHAPES.items():
        for f in fields(shape.config_cls):
            default = getattr(shape.config_cls(), f.name)
            if isinstance(default, bool):
                continue
            values = INT_EXTREMES if isinstance(default, int) else FLOAT_EXTREMES
            for v in values:
                yield pytest.param(name, f.name, v, id=f"{name}.{f.name}={v}")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("shape,param,value", list(_shape_cases()))
def test_shape_parameter_at_extremes(shape, param, value):
    try:
        cfg = make_config(SHAPES[shape], {param: value})
    except WorkloadError:
        return  # unparsable as the field's type: refused
    _drive(GenerateOptions(shape, N, seed=1), cfg)  # warm start: the longer plan
