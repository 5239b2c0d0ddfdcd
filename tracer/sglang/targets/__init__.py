"""Targets: the code bases kvtrace captures, recognized from their code, and the hooks' contracts.

Standard library only (the real-code backend checks a target before importing sglang).

- ``table.py``: THE table. ``HOOKS``: the canonical hooks (``pool.device``, ``cache.match``,
  ``sched.step``...: what a trace needs, with the pools each one's rows account for).
  ``TARGETS``: ``sglang-0.5.23``, ``bytedance-dsv4-post659``, ``bytedance-dsv4-pre659``; each
  with its hook modules, the source files of its fingerprint, the known fingerprints and a
  recognizer (names and parameter shapes that must, or must not, be in the source).
- ``detect.py``: ``detect()`` -> ``Detection``: which target the imported code is, from its
  source files (fingerprint, else recognizer), never from the version string: 0.5.23 built as
  ``0.5.23.post1`` or ``0.5.23+local`` is ``sglang-0.5.23``.
- ``contract.py``: ``Contract`` (hook, module, class, method, exact parameters, attributes read,
  levels, optional) and its live check.
- ``coverage.py``: every hook's state (``installed``, ``absent``, ``mismatch`` with the reason,
  ``skipped``, ``unused``), the pools fully accounted, and the coverage state
  (``full``/``partial``/``none`` -> trace state ``complete``/``partial``/``uncovered``).

Interface of a hook module (``tracer.sglang.hooks.<name>``, or ``tracer.sglang.hooks.fork.<name>``
for the DeepSeek-V4 fork), listed in its target's ``hook_modules``:

    CONTRACTS: tuple[Contract, ...]   # one per callable it wraps (top level, declarative)
    def install(patcher, lazy: bool = False, level: str = "counts") -> int:
        ...                           # wrap what is imported (lazy) or import and wrap;
                                      # return how many were wrapped now; idempotent

``tracer.sglang.hooks.install`` detects the target, skips a module whose required contracts
mismatch (its hooks would write wrong rows), calls ``install`` of the others, then computes each
hook's state from the contracts and the patcher (a contract is ``installed`` when the patcher
wrapped its method on its class or a subclass). Everything happens at install time.
"""

from tracer.sglang.targets.contract import (  # noqa: F401
    ABSENT,
    INSTALLED,
    LEVELS,
    MISMATCH,
    ROW_LEVELS,
    SKIPPED,
    UNUSED,
    Check,
    Contract,
    check,
)
from tracer.sglang.targets.coverage import (  # noqa: F401
    TRACE_STATE,
    contracts_of,
    coverage,
    hook_states,
)
from tracer.sglang.targets.detect import Detection, detect, installed_version  # noqa: F401
from tracer.sglang.targets.table import (  # noqa: F401
    DSV4_POST659,
    DSV4_PRE659,
    HOOKS,
    SGLANG_0_5_23,
    TARGETS,
    Hook,
    Target,
    by_name,
)

# the re-exported names (this package is their public home: ``tracer.sglang.targets.detect()``, ...)
__all__ = ["ABSENT", "INSTALLED", "LEVELS", "MISMATCH", "ROW_LEVELS", "SKIPPED", "UNUSED", "Check", "Contract", "check",
           "TRACE_STATE", "contracts_of", "coverage", "hook_states",
           "Detection", "detect", "installed_version",
           "DSV4_POST659", "DSV4_PRE659", "HOOKS", "SGLANG_0_5_23", "TARGETS", "Hook", "Target", "by_name"]
