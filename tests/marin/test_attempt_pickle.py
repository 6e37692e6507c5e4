"""Attempts whose step function and config class live in the driver's `__main__` (an experiment script) carry
tokens into a table shipped once, instead of the script's code in every payload; a process that cannot import
that `__main__` rebuilds the attempt from the payload and the table."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from ray import cloudpickle

from marin.execution.attempt_pickle import dumps_with_table, from_main, loads_with_table, table_for

SCRIPT = textwrap.dedent('''
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class ScaleConfig:
        output_path: str
        factor: int = 3

    def scale(cfg):
        return f"scaled-by-{cfg.factor}-in-{cfg.output_path}-UNIQUE-MARKER"
''')


def _script_objects() -> tuple[Any, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(SCRIPT, "<experiment script>", "exec"), namespace)
    return namespace["scale"], namespace["ScaleConfig"]


def test_script_objects_travel_once_in_the_table_not_in_each_payload() -> None:
    scale, config_class = _script_objects()
    assert from_main(scale) and from_main(config_class) and not from_main(pickle.dumps)
    table: dict[str, Any] = {}
    first = dumps_with_table((scale, config_class("/out/a"), "/out/a/log", {}, None), table)
    assert sorted(table.values(), key=id) == sorted([scale, config_class], key=id)
    second = dumps_with_table((scale, config_class("/out/b", factor=5), "/out/b/log", {}, None), table)
    assert len(table) == 2  # nothing new to ship
    by_value = cloudpickle.dumps((scale, config_class("/out/b", factor=5), "/out/b/log", {}, None))
    assert b"UNIQUE-MARKER" in by_value and b"UNIQUE-MARKER" not in first + second
    assert len(second) * 3 < len(by_value)
    fn, config, *_ = loads_with_table(second, table)
    assert fn is scale and fn(config) == "scaled-by-5-in-/out/b-UNIQUE-MARKER"
    with pytest.raises(pickle.UnpicklingError, match="which its run's table does not hold"):
        loads_with_table(second, {})


def test_a_process_that_cannot_import_the_script_rebuilds_the_attempt(tmp_path: Any) -> None:
    scale, config_class = _script_objects()
    table: dict[str, Any] = {}
    payload = dumps_with_table((scale, config_class("/out/c", factor=7), "/out/c/log", {}, None), table)
    (tmp_path / "payload").write_bytes(payload)
    (tmp_path / "table").write_bytes(cloudpickle.dumps(table))
    worker = textwrap.dedent(f'''
        from pathlib import Path
        from marin.execution.attempt_pickle import loads_with_table, table_for
        calls = []
        def fetch():
            calls.append(1)
            return Path({str(tmp_path / "table")!r}).read_bytes()
        payload = Path({str(tmp_path / "payload")!r}).read_bytes()
        for _ in range(3):  # the table is unpickled once per process, then reused
            fn, config, log, env, record = loads_with_table(payload, table_for("run-1", fetch))
        print(fn(config), type(config).__name__, len(calls))
    ''')
    out = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["scaled-by-7-in-/out/c-UNIQUE-MARKER", "ScaleConfig", "1"]


def test_tables_are_cached_by_key() -> None:
    fetched: list[str] = []

    def fetch(name: str) -> Any:
        return lambda: (fetched.append(name), pickle.dumps({name: 1}))[1]

    assert table_for("k-a", fetch("a")) == {"a": 1}
    assert table_for("k-a", fetch("again")) == {"a": 1}
    assert table_for("k-b", fetch("b")) == {"b": 1}
    assert fetched == ["a", "b"]
