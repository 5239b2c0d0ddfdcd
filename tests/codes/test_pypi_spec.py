"""``sglang==X`` code specs (``replay/codes/pypi.py``): parsing, refusals, and the unpack/prepare
path of a release's wheel, offline.

pip is never run here except in the one ``network`` test: :func:`replay.codes.pypi.download_wheel`
is replaced by one that writes a wheel built in ``tmp_path`` from files of the installed sglang
(the files its target's fingerprint covers, so the release is recognized by code as the
installed one is). The code cache is a ``tmp_path`` (``KVTRACE_CODES_DIR``).
"""

from __future__ import annotations

import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay.codes import CodePrepareError, prepare, pypi
from replay.runs.code import resolve_code
from replay.runs.replay import RunError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "codes"
    monkeypatch.setenv("KVTRACE_CODES_DIR", str(root))
    return root


def _installed_sglang() -> Path:
    from tracer.sglang.targets.source import sglang_root

    root = sglang_root()
    assert root is not None and (root / "__init__.py").is_file(), "the real sglang 0.5.23 is installed by make"
    return root


def _fake_wheel(path: Path, version: str, *, recognizable: bool) -> Path:
    """A wheel of ``sglang/`` (+ dist-info): the installed sglang's fingerprinted files, or just
    an ``__init__.py`` (a code no target knows)."""
    from tracer.sglang.targets.source import module_file
    from tracer.sglang.targets.table import SGLANG_0_5_23

    src = _installed_sglang()
    files = {"sglang/__init__.py": (src / "__init__.py").read_bytes() if recognizable else b""}
    if recognizable:
        for module in SGLANG_0_5_23.files:
            f = module_file(src, module)
            if f is not None:
                files["sglang/" + str(f.relative_to(src))] = f.read_bytes()
    files[f"sglang-{version}.dist-info/METADATA"] = f"Name: sglang\nVersion: {version}\n".encode()
    files["../escape.py"] = b"outside"  # never unpacked outside the code dir
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():  # fixed dates: the same files give the same bytes
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Replace the download: ``calls`` counts them; ``recognizable`` picks the wheel's content."""
    state = {"calls": 0, "recognizable": True}

    def download(version: str, dest: Path) -> Path:
        state["calls"] += 1
        return _fake_wheel(dest / f"sglang-{version}-py3-none-any.whl", state.get("metadata_version", version),
                           recognizable=state["recognizable"])

    monkeypatch.setattr(pypi, "download_wheel", download)
    return state


def test_release_spec_parsing():
    assert pypi.release_version("sglang==0.5.22") == "0.5.22"
    assert pypi.release_version("sglang==0.5.3.post1") == "0.5.3.post1"
    assert pypi.release_version("/x/sglang-post659.tar.xz") is None
    for bad in ("sglang==", "sglang==banana", "sglang==0.5 .1"):
        with pytest.raises(CodePrepareError, match="expected sglang==VERSION"):
            pypi.release_version(bad)


def test_pip_error_is_one_short_line():
    versions = ", ".join(f"0.{i}.0" for i in range(40))
    text = ("WARNING: Location 'file:///opt/pypi/simple/sglang/' is ignored\n"
            f"ERROR: Could not find a version that satisfies the requirement sglang==9.9.9 (from versions: {versions})\n"
            "ERROR: No matching distribution found for sglang==9.9.9\n")
    line = pypi.pip_error(text)
    assert "\n" not in line and "0.1.0, ..., 0.37.0, 0.38.0, 0.39.0; 40 in all" in line
    assert line.endswith("No matching distribution found for sglang==9.9.9")
    offline = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(...: "
               "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')'\n"
               "ERROR: Could not find a version that satisfies the requirement sglang==0.5.22 (from versions: none)\n")
    assert pypi.pip_error(offline).endswith("(from versions: none); the index could not be reached (no network?)")


def test_a_version_pip_cannot_fetch_is_refused_naming_it(cache, monkeypatch):
    def pip_fails(cmd, **kw):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and cmd[-1] == "sglang==9.9.9"
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for sglang==9.9.9\n")

    monkeypatch.setattr(pypi.subprocess, "run", pip_fails)
    with pytest.raises(CodePrepareError) as e:
        prepare("sglang==9.9.9")
    assert str(e.value) == ("sglang==9.9.9: pip could not download it: No matching distribution found for "
                            "sglang==9.9.9")
    with pytest.raises(RunError, match=r"^code sglang-9\.9\.9: cannot prepare sglang==9\.9\.9: pip could not"):
        resolve_code("sglang==9.9.9")
    assert not (cache / "pypi" / "sglang-9.9.9.json").exists()


def test_the_refusal_reaches_the_command_line_without_a_traceback(cache, monkeypatch, tmp_path):
    from replay.cli import main as cli

    monkeypatch.setattr(pypi.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for sglang==9.9.9\n"))
    wl = tmp_path / "wl"
    res = CliRunner().invoke(cli, ["workload", "generate", "--shape", "shared_prefix", "--requests", "3",
                                   "--out", str(wl)])
    assert res.exit_code == 0, res.output
    for args in (["replay", str(wl), "--out", str(tmp_path / "R")],
                 ["record", "--workload", str(wl), "--out", str(tmp_path / "T")]):
        res = CliRunner().invoke(cli, args + ["--code", "sglang==9.9.9"])
        assert res.exit_code == 2, res.output
        assert "cannot prepare sglang==9.9.9: pip could not download it: No matching distribution" in res.output
        assert "Traceback" not in res.output


def test_the_installed_version_is_the_installed_sglang(cache, fake_pip):
    from tracer.sglang.targets import detect

    version = detect().sglang_version
    code = resolve_code(f"sglang=={version}")
    assert code.installed and code.target == "sglang-0.5.23" and fake_pip["calls"] == 0


def test_a_release_wheel_is_unpacked_cached_by_content_and_recognized_by_code(cache, fake_pip):
    env = prepare("sglang==0.5.99")
    assert not env.cached and fake_pip["calls"] == 1 and set(env.steps) >= {"download_s", "unpack_s"}
    assert env.python_dir == cache / "code" / env.sha and (env.python_dir / "sglang" / "__init__.py").is_file()
    assert not (cache / "escape.py").exists() and not (cache / "code" / "escape.py").exists()
    assert env.pins == () and env.overlay_dir is None
    assert not list(cache.rglob("*.whl")), "the wheel is deleted once unpacked"
    assert (cache / "pypi" / "sglang-0.5.99.json").is_file()
    t0 = time.perf_counter()
    again = prepare("sglang==0.5.99")
    took_s = time.perf_counter() - t0
    assert again.cached and again.python_dir == env.python_dir and again.sha == env.sha
    assert fake_pip["calls"] == 1 and took_s <= 1.0, took_s
    # another release with the same bytes shares the code dir (the key is the wheel's content)
    fake_pip["metadata_version"] = "0.5.99"
    assert prepare("sglang==0.5.98").python_dir == env.python_dir and fake_pip["calls"] == 2
    # recognized by its code (the fingerprinted files are 0.5.23's), never by the version string;
    # it runs on the real-code backend in its own process
    code = resolve_code("sglang==0.5.99")
    assert code.target == "sglang-0.5.23" and code.fingerprint_known and code.backend == "sglang"
    assert not code.installed and code.env.python_dir == env.python_dir


def test_an_unknown_release_is_refused_as_other_specs_are(cache, fake_pip):
    fake_pip["recognizable"] = False
    with pytest.raises(RunError, match=r"code old \(sglang==0\.0\.1\): no known target: the sglang at .* is none of"):
        resolve_code("sglang==0.0.1", "old")


def test_a_damaged_wheel_or_cache_entry(cache, monkeypatch, tmp_path):
    def not_a_zip(version, dest):
        (dest / "sglang-1.0-py3-none-any.whl").write_text("not a zip")
        return dest / "sglang-1.0-py3-none-any.whl"

    monkeypatch.setattr(pypi, "download_wheel", not_a_zip)
    with pytest.raises(CodePrepareError, match=r"sglang-1\.0-py3-none-any\.whl: not a wheel \(zip\)"):
        prepare("sglang==1.0")
    assert not (cache / "pypi" / "sglang-1.0.json").exists() and not list((cache / "code").glob("*"))
    # an index entry whose code dir is gone downloads again
    calls = []
    monkeypatch.setattr(pypi, "download_wheel", lambda v, d: calls.append(v) or _fake_wheel(
        d / "sglang-1.0-py3-none-any.whl", v, recognizable=False))
    (cache / "pypi" / "sglang-1.0.json").write_text('{"sha": "0123456789abcdef"}')
    assert (prepare("sglang==1.0").python_dir / "sglang" / "__init__.py").is_file() and calls == ["1.0"]


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_real_wheel_of_the_installed_release(cache):
    """The one real download: sglang==0.5.23's wheel from PyPI (39 MB, ~2 s download + ~2 s unpack
    measured), recognized as 0.5.23 by its fingerprint. Skipped, naming pip's error, only when the
    index cannot be reached."""
    try:
        env = prepare("sglang==0.5.23")
    except CodePrepareError as e:
        if "could not be reached" in str(e) or "from versions: none" in str(e):
            pytest.skip(f"PyPI unreachable: {e}")
        raise
    from tracer.sglang.targets import detect

    det = detect(env.python_dir / "sglang")
    assert det.target_name == "sglang-0.5.23" and det.fingerprint_known, det.reason
    t0 = time.perf_counter()
    assert prepare("sglang==0.5.23").cached and time.perf_counter() - t0 <= 1.0
