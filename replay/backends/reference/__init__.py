"""The reference backend: sglang 0.5.23's scheduler restated over ``replay.memory`` (DESIGN.md §4).

Expresses what the real classes cannot (``prefix_ownership=eic_release_protected_prefix``, eviction
plug-ins by ``pkg.mod:Class``), runs faster than the real code, and is an independent oracle for it
(``tests/differential``, ``docs/fidelity.md``). A run is a schema-v1 trace written through the
tracer's API, read by every analysis like a real run's.
"""

from replay.backends.reference.settings import ReferenceSettings, from_knobs

__all__ = ["ReferenceSettings", "from_knobs"]
