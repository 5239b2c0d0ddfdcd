"""Parts of the hooks that need no sglang: page hashes, argv parsing, the .pth line, patching."""

from __future__ import annotations

from array import array

import numpy as np

from tracer.sglang.activation import autoload, serverinfo
from tracer.sglang.patching import Patcher
from tracer.sglang.runtime.requests import page_hashes


def test_page_hashes_share_exactly_the_equal_prefix_blocks():
    a = array("q", range(1, 16 * 40 + 1))
    b = array("q", list(range(1, 16 * 25 + 1)) + [7] * (16 * 15))
    ha, hb = page_hashes(a, 16), page_hashes(b, 16)
    assert len(ha) == len(hb) == 40 and ha.dtype == np.uint64
    assert (ha[:25] == hb[:25]).all() and (ha[25:] != hb[25:]).all()
    # only full blocks; list input == array input; a different block size changes everything
    assert (page_hashes(list(a)[:16 * 3 + 5], 16) == ha[:3]).all()
    assert page_hashes(a, 0) is None and len(page_hashes([1, 2, 3], 16)) == 0
    assert not set(page_hashes(a, 32).tolist()) & set(ha.tolist())
    # the same block content at another position hashes differently (chained)
    c = array("q", list(range(1, 17)) * 2)
    hc = page_hashes(c, 16)
    assert hc[0] != hc[1]
    assert len(set(page_hashes(array("q", range(1, 16 * 5000 + 1)), 16).tolist())) == 5000


def test_server_flags_from_argv():
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m/x", "--page-size", "64",
            "--swa-full-tokens-ratio=0.1", "--chunked-prefill-size", "8192",
            "--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-write-policy",
            "write_back", "--radix-eviction-policy", "lfu", "--tp", "4", "--unknown", "1"]
    s = serverinfo.from_argv(argv)
    assert s == {"model": "m/x", "page_size": 64, "swa_full_tokens_ratio": 0.1,
                 "chunked_prefill_size": 8192, "enable_hierarchical_cache": True,
                 "hicache_ratio": 2.0, "hicache_write_policy": "write_back",
                 "eviction_policy": "lfu", "tp_size": 4, "cache_kind": "hicache"}


def test_pth_line_is_one_import_line_gated_on_kvtrace_dir():
    line = autoload.pth_line()
    assert line.startswith("import ") and line.count("\n") == 1
    assert "KVTRACE_DIR" in line and str(autoload.BOOT_FILE.resolve()) in line


def test_patcher_restores_exact_objects_and_removes_added_attributes():
    class Base:
        def f(self):
            return "base"

    class Leaf(Base):
        def g(self):
            return "g"

    orig_g, orig_f = Leaf.__dict__["g"], Base.__dict__["f"]
    p = Patcher()
    wrap = lambda fn: (lambda self: "w" + fn(self))  # noqa: E731
    assert p.wrap_method(Leaf, "g", wrap) and not p.wrap_method(Leaf, "g", wrap)
    assert p.wrap_inherited(Leaf, "f", wrap)
    assert Leaf().f() == "wbase" and Base().f() == "base" and Leaf().g() == "wg"
    assert p.restore() == 2
    assert Leaf.__dict__["g"] is orig_g and "f" not in Leaf.__dict__ and Base.__dict__["f"] is orig_f


def test_scheduler_loop_boundary_writes_one_step_row_per_iteration(tmp_path):
    """The real Scheduler cannot be built on CPU (it imports the serving stack); its hook is
    exercised on a stand-in with the same method, as the real event loop calls it."""
    import types

    import tracer
    from tests.sglang.hooks_util import rows
    from tracer.schema import Mode
    from tracer.sglang.hooks import scheduler as stats
    from tracer.sglang.runtime.sampler import loop

    calls = []

    def get_next_batch_to_run(self, running_batch=None, last_batch=None):
        calls.append(self.forward_ct)
        return self.plan

    wrapped = stats._make_get_next_batch()(get_next_batch_to_run)
    sched = types.SimpleNamespace(forward_ct=0, tree_cache=None, token_to_kv_pool_allocator=None,
                                  plan="plan")
    loop.__init__()
    tracer.start(tmp_path / "t", source="sglang-hooks")
    try:
        for ct in range(1, 4):  # three busy iterations, then idle spinning
            assert wrapped(sched) == "plan"
            loop.note_batch(int(Mode.DECODE), 8, 8)  # what prepare_for_decode notes
            sched.forward_ct = ct
        for _ in range(50):
            wrapped(sched)
    finally:
        tracer.stop()
        loop.__init__()
    steps = [r for r in rows(tmp_path / "t", "sched") if r["kind"] == "step"]
    assert [(r["mode"], r["batch_size"]) for r in steps] == [("decode", 8)] * 3 + [("idle", 0)]
    assert [r["forward_ct"] for r in steps[:3]] == [1, 2, 3]
    assert all(r["step_ns"] > 0 for r in steps)  # the idle spin: one row per KVTRACE_IDLE_SAMPLE_MS
    assert len(calls) == 53


def test_exact_wrappers_fall_back_to_a_counted_pass_through_on_other_parameters():
    from tracer.sglang.runtime import state
    from tracer.sglang.patching import exact, exact_only, params_of

    def lock(self, node_id: int, skip_lock_components=()) -> None:
        return (node_id, skip_lock_components)

    assert params_of(lock) == "(self, node_id, skip_lock_components=())"
    calls = []

    def make(orig):
        def w(self, node_id, skip_lock_components=()):
            calls.append(node_id)
            return orig(self, node_id, skip_lock_components)
        return w

    state.failures.clear()
    w = exact_only("(self, node_id, skip_lock_components=())", make)(lock)
    assert w(None, 3) == (3, ()) and calls == [3] and not state.failures
    # another signature: the original runs untouched through a pass-through, counted once
    other = exact_only("(self, node_id)", make)(lock)
    assert other(None, 4, skip_lock_components=(1,)) == (4, (1,)) and calls == [3]
    assert list(state.failures) == ["install.test_exact_wrappers_fall_back_to_a_counted_pass_through_on_other_parameters.<locals>.lock"]
    state.failures.clear()
    # exact(): the generic wrapper instead
    g = exact("(self)", make, lambda orig: (lambda *a, **k: ("generic", orig(*a, **k))))(lock)
    assert g(None, 5) == ("generic", (5, ()))
