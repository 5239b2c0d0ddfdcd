"""Which target is this code? Decided from the source of the sglang package this interpreter
imports (never from package metadata): a known fingerprint of the target's files, else its
recognizer (names and parameter shapes read by an AST pass).

Strictness: a known fingerprint is the target, exactly the code it was tested on. An unknown
fingerprint whose recognizer passes is still the target, recorded with ``fingerprint_known``
false ("fingerprint unknown"); each hook's contract is then checked live at install, so a
changed signature or a missing attribute shows as that hook's ``mismatch``, never as wrong rows.
No recognizer passing: no target (``uncovered``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tracer.sglang.targets import source
from tracer.sglang.targets.table import TARGETS, Target


@dataclass(frozen=True)
class Detection:
    """What ``detect`` found.

    Attributes:
        target: the matched target, or None.
        root: the sglang package directory read (None: no sglang importable).
        fingerprint: the matched target's fingerprint (or the first target's, unmatched).
        fingerprint_known: whether it is one of the target's known fingerprints.
        sglang_version: the installed distribution's version string (informative only).
        reason: one line: why it is this target, or why none matched.
        misses: target name -> what its recognizer did not find (for the unmatched ones).
    """

    target: Target | None
    root: str | None
    fingerprint: str | None
    fingerprint_known: bool
    sglang_version: str | None
    reason: str
    misses: dict = field(default_factory=dict)

    @property
    def target_name(self) -> str | None:
        return self.target.name if self.target is not None else None

    def as_dict(self) -> dict:
        return {"target": self.target_name, "sglang_root": self.root,
                "fingerprint": self.fingerprint, "fingerprint_known": self.fingerprint_known,
                "sglang_version": self.sglang_version, "reason": self.reason}


def installed_version() -> str | None:
    """The ``sglang`` distribution's version string, or None (recorded, never decisive)."""
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


def _need(index: source.SourceIndex, spec: str) -> str | None:
    """None when ``module:Qual[(shape)]`` is in the source, else what is missing."""
    module, _, qual = spec.partition(":")
    want = None
    if "(" in qual:
        qual, want = qual[:qual.index("(")], qual[qual.index("("):]
    found, got = index.lookup(module, qual)
    if not found:
        return f"no {module}:{qual}"
    if want is not None and got is not None and source.shape(got) != source.shape(want):
        return f"{module}:{qual}{got}, expected {want}"
    return None


def recognize(index: source.SourceIndex, t: Target) -> list[str]:
    """What ``t``'s recognizer misses in ``index`` (empty: recognized)."""
    misses = [m for m in (_need(index, s) for s in t.requires) if m]
    for s in t.forbids:
        if _need(index, s) is None:
            misses.append(f"{s} present")
    return misses


_cache: dict = {}


def detect(root: str | Path | None = None, *, targets: tuple[Target, ...] = TARGETS,
           use_cache: bool = True) -> Detection:
    """The target of the sglang source at ``root`` (default: the package this interpreter
    imports, see ``source.sglang_root``). Reads files only; never imports sglang.

    Cached per root (the source of a running process does not change).
    """
    r = Path(root).resolve() if root is not None else source.sglang_root()
    key = (str(r), tuple(t.name for t in targets))
    if use_cache and key in _cache:
        return _cache[key]
    version = installed_version()
    if r is None or not (r / "__init__.py").is_file():
        d = Detection(None, str(r) if r else None, None, False, version,
                      "no sglang package importable here")
    else:
        d = _detect(r, targets, version)
    if use_cache:
        _cache[key] = d
    return d


def _detect(r: Path, targets, version) -> Detection:
    prints = {t.name: source.fingerprint(r, t.files) for t in targets}
    for t in targets:
        if prints[t.name] in t.fingerprints:
            return Detection(t, str(r), prints[t.name], True, version,
                             f"{t.name}: known source fingerprint {prints[t.name]}")
    index = source.SourceIndex(r)
    misses = {}
    for t in targets:
        m = recognize(index, t)
        if not m:
            return Detection(t, str(r), prints[t.name], False, version,
                             f"{t.name}: names and signatures match; fingerprint unknown "
                             f"({prints[t.name]})")
        misses[t.name] = m
    closest = min(misses, key=lambda n: len(misses[n]))
    first = prints[targets[0].name] if targets else None
    return Detection(None, str(r), first, False, version,
                     f"no known target: the sglang at {r} (version {version or '?'}) is none of "
                     f"{', '.join(t.name for t in targets)}; closest {closest}: "
                     f"{'; '.join(misses[closest][:3])}", misses)
