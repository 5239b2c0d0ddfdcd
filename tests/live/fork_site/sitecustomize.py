# kvtrace live-server tests: make every process of a *code's* server (the DeepSeek-V4 fork) run
# on CPU. Put this directory on PYTHONPATH after the code's python dir and overlay
# (replay.codes.code_environ gives those) and the repository root.
#
# At interpreter start-up, when KVTRACE_CODE_PYTHON is set:
#   1. when KVTRACE_LIVE_SITE_DIR is set, adds that directory as a site dir first, so a `.pth`
#      written there by `kvtrace hooks install-pth --site-dir` arms the autoload as it would from
#      site-packages (before sglang is imported);
#   2. calls replay.codes.bootstrap.bootstrap(): import stubs (triton, torchvision, sgl_kernel),
#      triton.runtime first, the code's sglang checked to come from KVTRACE_CODE_PYTHON, torch
#      fallbacks for the paged allocator kernels, host data-copy no-ops.
# Every process of the server tree (tokenizer manager, scheduler, detokenizer: spawned
# interpreters) runs it. A `kvtrace launch` shim chains to this file after arming the autoload.
import os as _os
import site as _site
import sys as _sys

if _os.environ.get("KVTRACE_CODE_PYTHON"):
    try:
        if _os.environ.get("KVTRACE_LIVE_SITE_DIR"):
            _site.addsitedir(_os.environ["KVTRACE_LIVE_SITE_DIR"])
        from replay.codes.bootstrap import bootstrap as _bootstrap

        _bootstrap()
    except Exception as _e:  # the server then fails at its own import, with this line before it
        _sys.stderr.write("kvtrace fork_site: bootstrap failed: %r\n" % (_e,))
