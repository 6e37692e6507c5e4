"""`marin plan` and the dashboard explain a re-addressed step with the same differences (both come from
marin/graph/changes.py): the plan of the edited pipeline, made before it runs, lists exactly the identity and
dependency rows the dashboard shows for the step once it ran, on the same prefix."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from marin import Step, output_path_of, this_output_path
from marin.dashboard import create_app
from marin.dashboard.diff import field_rows
from marin.graph.changes import Change, identity_changes, previous_version, version_names
from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers


def _pipeline(n: int, subpath: str = "numbers.txt", version: str | None = None) -> Step:
    numbers = Step(
        name="agree/numbers",
        fn=write_numbers,
        version=version,
        config=WriteConfig(output_path=this_output_path(), n=n),
    )
    return Step(
        name="agree/total",
        fn=sum_numbers,
        config=SumConfig(input_path=output_path_of(numbers, subpath), output_path=this_output_path()),
    )


def _rows(rows: list[Any]) -> list[tuple[str, str, Any, Any]]:
    return [
        (r["field"], r["kind"], r["old"], r["new"])
        for r in rows
        if r["field"] not in ("fn", "fn_source_hash")
    ]


def test_plan_and_dashboard_agree_on_what_changed(run_marin: Any, marin_prefix: str) -> None:
    assert run_marin([_pipeline(3)]).status == "SUCCESS"
    edited = _pipeline(5, version="2")
    plan = run_marin([edited], dry_run=True).plan
    planned = {e.name: [r.model_dump() for r in field_rows(e.changes)] for e in plan.entries}
    assert run_marin([edited]).status == "SUCCESS"
    with TestClient(create_app(marin_prefix, cache_ttl=0)) as c:
        for entry in plan.entries:
            rel = entry.output_path.removeprefix(marin_prefix).lstrip("/")
            shown = c.get(f"/api/steps/{quote(rel)}").json()["changes"]
            assert shown["previous"]["hash"] == entry.previous_hash, entry.name
            assert _rows(shown["changes"]) == _rows(planned[entry.name]) and planned[entry.name], entry.name
    assert ("version", "changed", None, "2") in _rows(planned["agree/numbers"])
    assert ("config.n", "changed", 3, 5) in _rows(planned["agree/numbers"])
    total = _rows(planned["agree/total"])
    assert total[0][:2] == ("dependency agree/numbers", "changed")
    assert ("dependency agree/numbers: config.n", "changed", 3, 5) in total
    assert not any(f.startswith("config.") for f, *_ in total)  # the placeholder's subpath did not change


def test_differences_and_versions_are_computed_one_way() -> None:
    old = {
        "version": None,
        "config": {"$type": "a.A", "lr": 0.1, "layers": [1, 2], "src": {"$dep": "x" * 64, "subpath": "a"}},
    }
    new = {
        "version": None,
        "config": {"$type": "a.B", "lr": 0.2, "layers": [1, 2, 3], "src": {"$dep": "y" * 64, "subpath": "b"}},
    }
    assert [c.describe() for c in identity_changes(old, new)] == [
        "config type: 'a.A' -> 'a.B'",
        "config.layers[2]: (absent) -> 3",
        "config.lr: 0.1 -> 0.2",
        "config.src.subpath: 'a' -> 'b'",
    ]
    dep = Change("dependency t", "changed", "1" * 64, "2" * 64, (Change("config.n", "changed", 1, 2),))
    assert dep.describe() == "dependency t changed: config.n: 1 -> 2"
    assert version_names(["m-0123abcd", "m-x", "mm-0123abcd", "m-89abcdef", "m"], "m") == [
        "m-0123abcd",
        "m-89abcdef",
    ]
    docs = [("a", {"created": 1.0}), ("b", {"created": 3.0}), ("c", {"created": 2.0})]
    assert previous_version(docs, None) == ("b", {"created": 3.0}, True)  # not run yet: the newest
    assert previous_version(docs, 2.5) == ("c", {"created": 2.0}, True)  # the last one before it
    assert previous_version(docs, 0.5) == ("b", {"created": 3.0}, False)  # the oldest: the newest other one
    assert previous_version([], 1.0) is None


def test_the_old_name_step_changes_warns_and_is_the_one_implementation() -> None:
    import marin.dashboard.diff as diff
    from marin.graph import changes

    with pytest.warns(DeprecationWarning, match="import step_changes from marin.graph.changes"):
        old = diff.step_changes
    assert old is changes.step_changes
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        diff.nothing_here  # noqa: B018
