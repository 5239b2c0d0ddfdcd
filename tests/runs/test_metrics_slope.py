"""``swa_used_slope_tokens_per_hour`` is the slope of the step function the ``stats`` samples
define: the hooks write a pool's sample only when it changed, a replay writes one every step, and
the two must give one figure (they did not while it was a fit through the samples)."""

from __future__ import annotations

import numpy as np
import pytest

from replay.runs.metrics import _step_slope


def test_a_ramp_gives_its_slope():
    x = np.linspace(0.0, 2.0, 2001)  # hours
    y = np.floor(x * 1000.0)  # +1000 tokens per hour, in whole tokens
    assert _step_slope(x, y) == pytest.approx(1000.0, rel=2e-3)
    assert _step_slope(x, np.full_like(x, 7.0)) == pytest.approx(0.0, abs=1e-9)
    assert _step_slope(x, 5000.0 - y) == pytest.approx(-1000.0, rel=2e-3)


def test_repeated_samples_change_nothing():
    rng = np.random.default_rng(3)
    x = np.sort(rng.uniform(0, 1, 200))
    y = rng.integers(0, 500, 200).astype(float)
    dense_x = np.sort(np.concatenate([x, rng.uniform(x[0], x[-1], 800)]))
    idx = np.searchsorted(x, dense_x, side="right") - 1  # each extra sample repeats the value before it
    dense_y = y[idx]
    assert _step_slope(dense_x, dense_y) == pytest.approx(_step_slope(x, y), rel=1e-9)
    # whereas a least-squares fit through the samples depends on where they were taken
    assert abs(np.polyfit(dense_x, dense_y, 1)[0] - np.polyfit(x, y, 1)[0]) > 1e-3


def test_degenerate_inputs():
    assert _step_slope(np.array([0.0, 0.0]), np.array([1.0, 2.0])) == 0.0
    assert _step_slope(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == 0.0  # one interval: flat
