"""Diagnosis of recorded traces: ``verify`` (is the recording sound, where does the accounting
break) and ``doctor`` (identity violations, growth trend, who holds SWA outside the window and
why, which knob stops it). Both read a trace through :mod:`replay.trace` and return objects;
``replay.cli.verify`` / ``replay.cli.doctor`` are thin wrappers.
"""

from __future__ import annotations

from replay.diagnosis.verify import VerifyReport, verify

__all__ = ["VerifyReport", "verify"]
