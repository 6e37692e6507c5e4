"""marin.jsonio: the engine's one canonical JSON, one atomic write and one read (None when missing, an error
naming the path when not JSON), and status.files.read_record, its lenient form for the engine's records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import openlab_records
from marin import jsonio
from marin.definition import canonical_json as exported_canonical_json
from marin.errors import CorruptFileError
from marin.status import files as sf
from marin.storage.local import LocalStorage


def test_canonical_json_is_the_records_package_one() -> None:
    assert jsonio.canonical_json is openlab_records.canonical_json is exported_canonical_json
    assert jsonio.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    with pytest.raises(ValueError):
        jsonio.canonical_json({"x": math.nan})
    assert jsonio.canonical_sha256({"a": 1}) == openlab_records.record_hash({"a": 1})


def test_read_json_none_when_missing_error_naming_the_path_when_not_json(tmp_path: Path) -> None:
    store = LocalStorage()
    assert jsonio.read_json(store, str(tmp_path / "absent.json")) is None
    cut = tmp_path / "cut.json"
    cut.write_text('{"a": 1')
    with pytest.raises(CorruptFileError, match=str(cut)):
        jsonio.read_json(store, str(cut))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(CorruptFileError, match=str(binary)):
        jsonio.read_json(store, str(binary))


def test_write_json_replaces_the_file_and_reads_back(tmp_path: Path) -> None:
    store, path = LocalStorage(), str(tmp_path / "record.json")
    jsonio.write_json(store, path, {"b": 1, "a": [1, 2]})
    jsonio.write_json(store, path, {"b": 2})
    assert jsonio.read_json(store, path) == {"b": 2}
    assert Path(path).read_text() == '{"b":2}\n'
    jsonio.write_json(store, path, {"b": 2, "a": 1}, pretty=True)
    assert Path(path).read_text() == json.dumps({"a": 1, "b": 2}, indent=1) + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary file left behind


def test_read_record_treats_a_torn_or_non_object_file_as_absent(tmp_path: Path) -> None:
    store = LocalStorage()
    (tmp_path / "torn.json").write_text('{"status": "RUN')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "ok.json").write_text('{"status": "SUCCESS"}')
    assert sf.read_record(store, str(tmp_path / "absent.json")) is None
    assert sf.read_record(store, str(tmp_path / "torn.json")) is None
    assert sf.read_record(store, str(tmp_path / "list.json")) is None
    assert sf.read_record(store, str(tmp_path / "ok.json")) == {"status": "SUCCESS"}
