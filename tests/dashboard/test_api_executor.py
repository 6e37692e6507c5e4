"""The JSON API and pages on prefixes written by real executor runs (tests/conftest.py's fixtures).

`mixed_run` leaves one real run in every state at once: mixed/ok SUCCESS, mixed/bad FAILED, mixed/child
DEP_FAILED and mixed/slow RUNNING until released.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from marin.dashboard import create_app


def _steps_by_name(detail: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in detail["steps"]}


def test_mixed_run_in_every_state(mixed_run: Any) -> None:
    with TestClient(create_app(mixed_run.prefix, cache_ttl=0)) as c:
        listing = c.get("/api/experiments").json()
        assert listing["total"] == 1
        exp = listing["items"][0]
        assert exp["state"] == "RUNNING" and exp["id"].startswith("exp7_mixed-")
        assert exp["issue"]["ref"] == "openlab/demo#7" and exp["issue"]["url"]
        assert exp["description"] == "every state at once"

        d = c.get(f"/api/experiments/{exp['id']}").json()
        steps = _steps_by_name(d)
        assert {n: s["status"] for n, s in steps.items()} == {
            "mixed/ok": "SUCCESS",
            "mixed/bad": "FAILED",
            "mixed/child": "DEP_FAILED",
            "mixed/slow": "RUNNING",
        }
        assert d["active"]
        assert [(e["source"], e["target"]) for e in d["dag"]["edges"]] == [
            (steps["mixed/bad"]["hash"], steps["mixed/child"]["hash"])
        ]

        bad = c.get(f"/api/steps/{quote(steps['mixed/bad']['path'])}").json()
        assert bad["status"]["error"]["type"] == "ValueError"
        assert bad["status"]["error"]["message"] == "planned failure"
        assert "ValueError: planned failure" in bad["status"]["error"]["traceback"]
        assert [e["event"] for e in bad["events"]][-1] == "FAILED" and "RUNNING" in [
            e["event"] for e in bad["events"]
        ]
        assert bad["attempts"][-1]["outcome"] == "FAILED" and bad["attempts"][-1]["log"]
        assert bad["fn"] == "tests.marin.fns:fail" and bad["config"]["message"] == "planned failure"
        assert bad["experiment"] == exp["id"] and bad["issue"]["ref"] == "openlab/demo#7"
        assert "about to fail" in c.get(f"/api/logs/{quote(steps['mixed/bad']['path'])}").json()["text"]

        child = c.get(f"/api/steps/{quote(steps['mixed/child']['path'])}").json()
        assert child["status"]["error"]["type"] == "DependencyFailed"
        assert [d["name"] for d in child["dependencies"]] == ["mixed/bad"]
        dep_path = child["status"]["error"]["dependency"]
        assert c.get(f"/api/steps/{quote(dep_path)}").json()["name"] == "mixed/bad"

        slow = c.get(f"/api/steps/{quote(steps['mixed/slow']['path'])}").json()
        assert slow["status"]["status"] == "RUNNING" and slow["active"] and slow["lease"] is not None

        for url in (
            "/",
            f"/experiments/{exp['id']}",
            f"/steps/{quote(steps['mixed/bad']['path'])}",
            f"/files/{quote(steps['mixed/ok']['path'])}",
        ):
            assert c.get(url).status_code == 200, url

        mixed_run.release()
        done = c.get(f"/api/experiments/{exp['id']}").json()
        assert _steps_by_name(done)["mixed/slow"]["status"] == "SUCCESS"
        assert done["state"] == "FAILED" and not done["active"]
        assert done["runs"][-1]["ended"] is not None


def test_changed_config_is_explained(run_marin: Any, marin_prefix: str) -> None:
    from marin import Step, output_path_of, this_output_path
    from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers

    def pipeline(n: int) -> Step:
        numbers = Step(
            name="demo/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=n)
        )
        return Step(
            name="demo/total",
            fn=sum_numbers,
            config=SumConfig(
                input_path=output_path_of(numbers, "numbers.txt"), output_path=this_output_path()
            ),
        )

    assert run_marin([pipeline(3)]).status == "SUCCESS"
    assert run_marin([pipeline(5)]).status == "SUCCESS"
    with TestClient(create_app(marin_prefix, cache_ttl=0)) as c:
        listing = c.get("/api/experiments").json()
        assert listing["total"] == 2 and {e["state"] for e in listing["items"]} == {"SUCCESS"}
        newest = c.get(f"/api/experiments/{listing['items'][0]['id']}").json()
        steps = _steps_by_name(newest)
        numbers = c.get(f"/api/steps/{quote(steps['demo/numbers']['path'])}").json()
        assert numbers["changes"]["previous"]["name"] == "demo/numbers"
        assert [(ch["field"], ch["old"], ch["new"]) for ch in numbers["changes"]["changes"]] == [
            ("config.n", 3, 5)
        ]
        total = c.get(f"/api/steps/{quote(steps['demo/total']['path'])}").json()
        fields = {ch["field"]: ch for ch in total["changes"]["changes"]}
        assert "dependency demo/numbers" in fields
        assert fields["dependency demo/numbers: config.n"]["old"] == 3
        assert fields["dependency demo/numbers: config.n"]["new"] == 5
        page = c.get(f"/steps/{quote(steps['demo/total']['path'])}").text
        assert "dependency demo/numbers: config.n" in page
        tail = c.get(f"/api/logs/{quote(steps['demo/total']['path'])}").json()
        assert "total=10" in tail["text"]
