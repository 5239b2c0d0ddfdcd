# kvtrace: the autoload boot file moved to tracer/sglang/activation/autoload_boot.py. This file
# stays for .pth files and launch shims written before the move (they execute it by path): it
# executes the new one. `kvtrace hooks install-pth` writes the new path.
import os as _os

_kvt_new = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "activation", "autoload_boot.py")
exec(compile(open(_kvt_new).read(), _kvt_new, "exec"), {"__name__": "kvtrace_autoload_boot"})
