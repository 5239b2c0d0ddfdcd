"""Codes: sglang source trees (the DeepSeek-V4 fork's tarballs, a directory) run on CPU.

- :func:`prepare` (``prepare.py``): unpack once, cached by content; light pins in a shared
  ``pip --target`` overlay; never touches the main venv.
- :func:`call_in_code` / :func:`run_in_code` (``runner.py``): run Python in the code's own
  process, bootstrapped by ``bootstrap.py`` (stubs, kernel fallbacks, host no-ops).

Standard library only at import time (see docs/fork.md).
"""

from replay.codes.prepare import CodeEnv, CodePrepareError, cache_root, overlay_pins, prepare
from replay.codes.runner import CodeCallError, CodeRun, call_in_code, code_environ, run_in_code

__all__ = ["CodeCallError", "CodeEnv", "CodePrepareError", "CodeRun", "cache_root", "call_in_code",
           "code_environ", "overlay_pins", "prepare", "run_in_code"]
