"""A run's summary is written whole or not at all: on a full disk the error names the file and
no temporary file is left; an interrupt while writing leaves none either."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from replay.runs.summary import write_json_atomic


def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    def full(self, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as e:
        write_json_atomic(tmp_path / "summary.json", {"a": 1})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "summary.json")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr("replay.runs.summary.os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    assert json.loads(path.read_text()) == {"a": 1}
