"""Targets recognized by code (tracer.sglang.targets): 0.5.23 whatever its version string, edited
code, the DeepSeek-V4 fork at both shared commits (from the tarballs, read as source), and each
hook's state from its contract."""

from __future__ import annotations

import importlib.metadata
import shutil
import tarfile
from pathlib import Path

import pytest

from tracer.sglang import targets
from tracer.sglang.targets import source

pytestmark = pytest.mark.sglang

SHARED = Path("/work/shared/targets/bytedance-dsv4")
REAL = source.sglang_root()


def _copy_target_files(dst: Path, target=targets.SGLANG_0_5_23) -> Path:
    """The source files a target's recognizer and fingerprint read, copied under ``dst/sglang``."""
    root = dst / "sglang"
    (root).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    mods = set(target.files) | {s.split(":")[0] for s in target.requires}
    for m in mods:
        f = source.module_file(REAL, m)
        if f is not None:
            out = root / f.relative_to(REAL)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)
    return root


@pytest.fixture(autouse=True)
def _fresh_detection(monkeypatch):
    """Each test detects afresh (a faked version string must not stay in the process cache)."""
    import sys

    monkeypatch.setattr(sys.modules["tracer.sglang.targets.detect"], "_cache", {})


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    """{commit: the unpacked fork's python/sglang} (unpacked here from the shared tarballs)."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} absent (the shared fork tarballs)")
    out = {}
    for c in ("pre659", "post659"):
        d = tmp_path_factory.mktemp(c)
        with tarfile.open(SHARED / f"sglang-{c}.tar.xz") as tf:
            tf.extractall(d, filter="data")
        out[c] = d / "python" / "sglang"
    return out


def test_installed_sglang_is_0_5_23_by_its_code():
    d = targets.detect(use_cache=False)
    assert d.target is targets.SGLANG_0_5_23 and d.fingerprint_known
    assert d.fingerprint in targets.SGLANG_0_5_23.fingerprints and "known source" in d.reason


@pytest.mark.parametrize("version", ["0.5.23.post1", "0.5.23+local", "0.6.0", "0+unknown"])
def test_the_version_string_decides_nothing(monkeypatch, version):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "sglang" else real(name))
    d = targets.detect(use_cache=False)
    assert d.target is targets.SGLANG_0_5_23 and d.sglang_version == version
    from tracer.sglang.versions import check_target

    assert check_target().target is targets.SGLANG_0_5_23


def test_version_strings_passed_explicitly_compare_their_release():
    from tracer.sglang.versions import UnsupportedSglang, check_version, release_of

    assert release_of("0.5.23.post1") == release_of("0.5.23+local") == "0.5.23"
    assert check_version("0.5.23.post1") == "0.5.23.post1"
    with pytest.raises(UnsupportedSglang, match="0.5.22"):
        check_version("0.5.22")


def test_a_copy_is_the_target_an_edit_is_fingerprint_unknown_a_change_is_no_target(tmp_path):
    root = _copy_target_files(tmp_path / "same")
    d = targets.detect(root, use_cache=False)
    assert d.target is targets.SGLANG_0_5_23 and d.fingerprint_known

    root = _copy_target_files(tmp_path / "edited")
    f = source.module_file(root, "sglang.srt.mem_cache.common")
    f.write_text(f.read_text() + "\n# a local comment\n")
    d = targets.detect(root, use_cache=False)
    assert d.target is targets.SGLANG_0_5_23 and not d.fingerprint_known
    assert "fingerprint unknown" in d.reason

    root = _copy_target_files(tmp_path / "changed")
    f = source.module_file(root, "sglang.srt.mem_cache.unified_radix_cache")
    text = f.read_text()
    assert "def checkpoint(" in text
    f.write_text(text.replace("def checkpoint(", "def checkpoint_renamed("))
    d = targets.detect(root, use_cache=False)
    assert d.target is None and "no known target" in d.reason
    assert any("checkpoint" in m for m in d.misses["sglang-0.5.23"])


def test_no_sglang_is_no_target(tmp_path):
    d = targets.detect(tmp_path / "nothing", use_cache=False)
    assert d.target is None and d.root is not None


def test_fork_commits_recognized_and_told_apart(fork):
    pre = targets.detect(fork["pre659"], use_cache=False)
    post = targets.detect(fork["post659"], use_cache=False)
    assert pre.target is targets.DSV4_PRE659 and pre.fingerprint_known
    assert post.target is targets.DSV4_POST659 and post.fingerprint_known
    assert pre.fingerprint != post.fingerprint
    # by names too, without the fingerprint: #659's _swa_chunk_cap / LRURefreshPhase
    idx_pre, idx_post = source.SourceIndex(fork["pre659"]), source.SourceIndex(fork["post659"])
    from tracer.sglang.targets.detect import recognize

    assert recognize(idx_post, targets.DSV4_POST659) == []
    assert recognize(idx_pre, targets.DSV4_PRE659) == []
    assert recognize(idx_pre, targets.DSV4_POST659) and recognize(idx_post, targets.DSV4_PRE659)
    assert recognize(idx_post, targets.SGLANG_0_5_23)  # the fork is not 0.5.23


def test_fork_without_hook_modules_is_uncovered(fork):
    d = targets.detect(fork["post659"], use_cache=False)
    cov = targets.coverage(d, targets.contracts_of([]), "counts", None)
    assert cov["state"] == "none" and cov["trace_state"] == "uncovered"
    assert {h["state"] for h in cov["hooks"].values()} == {"absent"}
    assert not any(p["accounted"] for p in cov["pools"].values())


def test_every_hook_module_declares_contracts_for_canonical_hooks():
    import importlib

    names = set()
    for t in targets.TARGETS:
        for m in t.hook_modules:
            mod = importlib.import_module(m)
            assert mod.CONTRACTS and callable(mod.install), m
            names |= {c.hook for c in mod.CONTRACTS}
    assert names == set(targets.HOOKS)


def test_watch_list_covers_every_target_file():
    from tracer.sglang import autoload_boot_names

    watched = autoload_boot_names()
    fork_mods = {m for t in (targets.DSV4_PRE659, targets.DSV4_POST659) for m in t.files
                 if m.startswith("sglang.srt.mem_cache.") and "components." not in m}
    assert fork_mods - {"sglang.srt.mem_cache.common", "sglang.srt.mem_cache.memory_pool_host",
                        "sglang.srt.mem_cache.memory_pool",
                        "sglang.srt.mem_cache.unified_radix_cache"} <= watched


def test_shape_drops_defaults_and_annotations():
    assert source.shape("(self, a=1, *, b: int, c=<X.Y: 1>, **kw)") == "(self, a, *, b, c, **kw)"


def test_the_real_code_backend_checks_the_code(monkeypatch):
    from replay.backends.sglang import env

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.5.23.post1" if name == "sglang" else real(name))
    assert env.check_sglang_version() == "0.5.23.post1"
