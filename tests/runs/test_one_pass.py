"""A plan's one-pass bound runs in a child process: the same figure as ``capacity_curve``, the
no-bound value where the source cannot be read, and a child killed when the plan stops early."""

from __future__ import annotations

from pathlib import Path

from replay.analysis.capacity import capacity_curve
from replay.runs.one_pass import NO_BOUND, OnePassBound

ROOT = Path(__file__).resolve().parents[2]
MIXED = ROOT / "data" / "workloads" / "mixed"


def test_the_child_gives_the_one_pass_curves_figure():
    full = 160_960
    with OnePassBound(MIXED, full) as bound:
        assert bound.result() == float(capacity_curve(MIXED).at(full))
        assert bound.result() == bound.result()  # read once, kept
    assert bound._proc.returncode == 0


def test_an_unreadable_source_gives_no_bound(tmp_path):
    with OnePassBound(tmp_path / "nope", 1000) as bound:
        assert bound.result() == NO_BOUND
    (tmp_path / "empty").mkdir()
    with OnePassBound(tmp_path / "empty", 1000) as bound:
        assert bound.result() == NO_BOUND


def test_closing_before_the_result_kills_the_child():
    bound = OnePassBound(MIXED, 160_960)
    bound.close()  # the plan stopped (a signal, an error) before its stop rule read the bound
    assert bound._proc.returncode is not None and bound._proc.stdout.closed
    bound.close()  # twice is harmless
