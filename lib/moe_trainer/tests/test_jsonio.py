"""The trainer's one JSON write and read (moe_trainer/jsonio.py): atomic, sorted, and what a missing or broken
file gives."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from moe_trainer.jsonio import JsonFileError, read_json, write_json_atomic


def test_write_then_read_round_trips_sorted_utf8_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "doc.json"
    write_json_atomic(str(path), {"b": 1, "a": "é", "c": [1]})
    assert path.read_bytes() == '{\n "a": "é",\n "b": 1,\n "c": [\n  1\n ]\n}'.encode()
    assert read_json(str(path)) == {"a": "é", "b": 1, "c": [1]}
    assert [p.name for p in path.parent.iterdir()] == ["doc.json"]


def test_default_converts_what_json_cannot_hold(tmp_path: Path) -> None:
    write_json_atomic(str(tmp_path / "r.json"), {"when": tmp_path}, default=str)
    assert json.loads((tmp_path / "r.json").read_text()) == {"when": str(tmp_path)}


def test_a_missing_file_reads_as_none_through_a_url_and_through_a_filesystem(tmp_path: Path) -> None:
    assert read_json(str(tmp_path / "absent.json")) is None
    fs = fsspec.filesystem("memory")
    assert read_json("/absent.json", fs) is None
    fs.pipe("/there.json", b'{"x": 1}')
    assert read_json("/there.json", fs) == {"x": 1}


def test_a_file_that_is_not_json_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"step": 4, "lo')
    with pytest.raises(JsonFileError, match=r"cut\.json is not a JSON document.*remove it"):
        read_json(str(path))
    assert path.read_text() == '{"step": 4, "lo'  # the broken file is left for whoever looks at it


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    write_json_atomic(str(path), {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"v": object()})
    assert read_json(str(path)) == {"v": 1}
