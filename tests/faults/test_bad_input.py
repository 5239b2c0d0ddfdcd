"""Malformed manifests, workloads, JSONL lines and generator options of every field type
(property-based): each is refused with a message naming the file/line/setting and the
expectation, a non-zero exit, and never a traceback (or accepted when it is valid)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.cli import main as cli
from tracer.schema import MANIFEST_KEYS

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _no_traceback(res):
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output


@pytest.fixture(scope="module")
def base_workload(tmp_path_factory):
    w = tmp_path_factory.mktemp("w") / "w"
    res = _invoke("workload", "generate", "--shape", "shared_prefix", "--requests", "5", "--out", w)
    assert res.exit_code == 0, res.output
    return w


@FAST
@given(key=st.sampled_from(sorted(MANIFEST_KEYS)), value=JSON_VALUES)
def test_manifest_field_of_any_type(tmp_path_factory, base_workload, key, value):
    w = tmp_path_factory.mktemp("m") / "w"
    shutil.copytree(base_workload, w)
    m = json.loads((w / "manifest.json").read_text())
    m[key] = value
    (w / "manifest.json").write_text(json.dumps(m))
    for args in (("inspect", "--strict", w), ("workload", "stats", w), ("recover", w)):
        res = _invoke(*args)
        _no_traceback(res)
        if res.exit_code:
            assert "manifest.json" in res.output or str(w) in res.output, res.output


@FAST
@given(doc=JSON_VALUES)
def test_manifest_of_any_json(tmp_path_factory, base_workload, doc):
    w = tmp_path_factory.mktemp("m") / "w"
    shutil.copytree(base_workload, w)
    (w / "manifest.json").write_text(json.dumps(doc))
    for args in (("inspect", w), ("recover", w), ("workload", "stats", w)):
        res = _invoke(*args)
        _no_traceback(res)
        assert res.exit_code != 0 and "manifest.json" in res.output, res.output


_MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}


@FAST
@given(field=st.sampled_from(sorted(_MOONCAKE)), value=JSON_VALUES)
def test_mooncake_line_field_of_any_type(tmp_path_factory, field, value):
    d = tmp_path_factory.mktemp("j")
    row = dict(_MOONCAKE, **{field: value})
    src = d / "m.jsonl"
    src.write_text(json.dumps(_MOONCAKE) + "\n" + json.dumps(row) + "\n")
    res = _invoke("workload", "import", "mooncake", src, "--out", d / "W")
    _no_traceback(res)
    if res.exit_code:
        assert f"{src}:2: field '" in res.output, res.output  # the line and the field at fault
    else:  # accepted: a valid workload whose rows the strict reader accepts too
        assert _invoke("inspect", "--strict", d / "W").exit_code == 0


@FAST
@given(opt=st.sampled_from(["--qps", "--cv", "--requests", "--seed", "--hash-block-tokens"]),
       value=st.sampled_from(["inf", "-inf", "nan", "-1", "0", "1e400", "-0", "x", str(2**64)]))
def test_generator_option_of_any_value(tmp_path_factory, opt, value):
    d = tmp_path_factory.mktemp("g")
    res = _invoke("workload", "generate", "--shape", "multi_turn", "--requests", "3", opt, value,
                  "--arrival", "gamma", "--out", d / "q")
    _no_traceback(res)
    if opt in ("--qps", "--cv") and value in ("inf", "-inf", "nan", "-1", "0", "1e400", "-0"):
        assert res.exit_code != 0 and opt in res.output, res.output
    if opt == "--seed" and value in ("-1", str(2**64)):
        assert res.exit_code != 0 and "--seed" in res.output


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(param=st.sampled_from(["mean_turns", "max_turns", "system_prompt_tokens_min", "think_time_median_s",
                              "first_user_tokens_median", "num_system_prompts"]),
       value=st.sampled_from(["inf", "nan", "-1", "0", "1e12"]))
def test_shape_parameter_of_any_value(tmp_path_factory, param, value):
    d = tmp_path_factory.mktemp("g")
    res = _invoke("workload", "generate", "--shape", "multi_turn", "--requests", "3", "--set",
                  f"{param}={value}", "--out", d / "q")
    _no_traceback(res)
    if value in ("inf", "nan", "-1"):
        assert res.exit_code != 0 and f"multi_turn.{param}" in res.output, res.output


def test_qps_inf_no_longer_hangs(tmp_path):
    res = _invoke("workload", "generate", "--shape", "multi_turn", "--requests", "10", "--qps", "inf",
                  "--out", tmp_path / "q")
    assert res.exit_code != 0 and "--qps inf: expected a finite rate > 0" in res.output
    assert not (tmp_path / "q").exists()


def test_force_replaces_only_kvtrace_directories(tmp_path, base_workload):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    for args in (("workload", "generate", "--shape", "multi_turn", "--requests", "3", "--force", "--out", precious),
                 ("workload", "import", "mooncake", Path(__file__).parents[1] / "workloads" / "fixtures"
                  / "mooncake_small.jsonl", "--force", "--out", precious),
                 ("launch", "--out", precious, "--force", "--", "true")):
        res = _invoke(*args)
        _no_traceback(res)
        assert res.exit_code != 0 and "not a kvtrace trace or workload" in res.output, res.output
        assert (precious / "thesis.tex").read_text() == "years of work"
    w = tmp_path / "w"
    shutil.copytree(base_workload, w)  # a workload is replaced with --force
    res = _invoke("workload", "generate", "--shape", "multi_turn", "--requests", "3", "--force", "--out", w)
    assert res.exit_code == 0, res.output


def test_file_as_out_or_parent_and_missing_site_dir(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = _invoke("workload", "generate", "--shape", "multi_turn", "--requests", "3", "--out", f / "q")
    _no_traceback(res)
    assert res.exit_code != 0 and f"{f} (a parent of {f / 'q'}) is a file" in res.output
    res = _invoke("hooks", "install-pth", "--site-dir", tmp_path / "nope")
    _no_traceback(res)
    assert res.exit_code == 2 and "--site-dir" in res.output and "no such directory" in res.output
    res = _invoke("launch", "--out", tmp_path / "l", "--", str(tmp_path))
    _no_traceback(res)
    assert res.exit_code == 2 and "is a directory; expected the server program" in res.output


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    import replay.inspection

    def boom(*a, **k):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(replay.inspection, "summarize", boom)
    monkeypatch.setattr("replay.cli.inspect.summarize", boom)
    res = _invoke("inspect", tmp_path)
    assert res.exit_code == 3
    assert "kvtrace: error: unexpected ZeroDivisionError: planted (run `kvtrace --debug ...` for the traceback)" in res.output
    res = _invoke("--debug", "inspect", tmp_path)
    assert isinstance(res.exception, ZeroDivisionError)


def _copy_with(base: Path, dst: Path, edit) -> Path:
    shutil.copytree(base, dst)
    edit(dst)
    return dst


def test_record_refuses_bad_workloads_and_outputs_before_running(tmp_path, base_workload):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def v2(w):
        m = json.loads((w / "manifest.json").read_text())
        (w / "manifest.json").write_text(json.dumps(dict(m, schema_version="2.0")))

    def wrong_type(w):
        f = next((w / "request").rglob("*.parquet"))
        t = pq.read_table(f)
        i = t.column_names.index("input_len")
        pq.write_table(t.set_column(i, "input_len", pa.array([str(x) for x in t.column(i).to_pylist()])), f)

    cases = [
        (("--workload", _copy_with(base_workload, tmp_path / "v2", v2), "--out", tmp_path / "o1"),
         "schema_version 2.0 is not supported"),
        (("--workload", _copy_with(base_workload, tmp_path / "wt", wrong_type), "--out", tmp_path / "o2"),
         "column 'input_len' has type string; expected int32"),
        (("--workload", base_workload, "--out", tmp_path / "o3", "--set", "max_context_tokens=64"),
         "--set max_context_tokens=64: a request row that small cannot hold"),
        (("--workload", base_workload, "--out", tmp_path), "a non-empty directory that is not a kvtrace trace"),
        (("--workload", base_workload, "--out", tmp_path / "v2" / "manifest.json" / "x"), "is a file"),
        (("--workload", base_workload, "--out", tmp_path / "o4", "--set", "swa_full_tokens_ratio=nan"),
         "swa_full_tokens_ratio"),
    ]
    for args, needle in cases:
        res = _invoke("record", *args)
        _no_traceback(res)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


@pytest.mark.slow
@pytest.mark.sglang
def test_record_with_every_request_aborted_fails(tmp_path, base_workload):
    res = _invoke("record", "--workload", base_workload, "--out", tmp_path / "t", "--json",
                  "--set", "max_running_requests=1", "--set", "full_pool_tokens=4096")
    _no_traceback(res)
    assert res.exit_code == 2, res.output
    assert "all 5 requests were aborted" in res.output and "backend.json" in res.output
