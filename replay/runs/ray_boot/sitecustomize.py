"""Run by Python at start-up in the Ray processes a local ``--executor ray`` sweep starts: their
``PYTHONPATH`` begins with this directory (``replay.runs.ray_start``; never in kvtrace's own
processes).

Every Ray process imports jsonschema (``ray.runtime_env``), and jsonschema imports its optional
IRI checker ``rfc3987_syntax`` if installed (jupyterlab's ``jsonschema[format-nongpl]`` installs
it), which builds an Earley grammar at import: 3.7 of the 4.7 s of CPU ``import ray`` takes on
this project's 2-core machine (python-jsonschema/jsonschema#1428). A local Ray starts five such
processes at once, and its raylet gives the dashboard agent a fixed 15 s (ray-project/ray#65983),
which a loaded machine missed. Marking the module absent makes jsonschema skip it, as it does
where the package is not installed: the ``iri`` and ``iri-reference`` formats go unchecked, and
Ray checks neither.

Then the ``sitecustomize`` this one hides, if another directory on ``sys.path`` has one, runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

sys.modules.setdefault("rfc3987_syntax", None)


def _run_the_hidden_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_run_the_hidden_one()
