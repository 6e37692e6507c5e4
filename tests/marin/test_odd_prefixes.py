"""Prefixes with characters that mean something in URIs and shells (`#`, `?`, `%`, spaces, non-ASCII),
through every place a prefix is used: the local tracker, plan, run and status of a tiny experiment on the
local backend, and the dashboard's JSON. Issue 32: SQLite's `file:` URI of the tracker was not escaped, so
a `#` or `?` cut the path and SQLite created a database outside the prefix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from marin.tracking.local import LocalTracker

ROOT = Path(__file__).resolve().parents[2]
ODD = {
    "hash": "runs #1",
    "query": "what?mode=rw&cache=x",
    "percent": "100%25 done %",
    "space": "my  runs ",
    "non_ascii": "expériences-日本-ü",
}
SCRIPT = '''"""exp3_odd: a tiny two-step experiment."""
from marin import Step, executor_main, output_path_of, this_output_path
from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers

numbers = Step(name="demo/numbers", fn=write_numbers,
               config=WriteConfig(output_path=this_output_path(), n=4))
total = Step(name="demo/total", fn=sum_numbers,
             config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                              output_path=this_output_path()))

if __name__ == "__main__":
    executor_main([total], description="odd prefix")
'''


@pytest.fixture(params=list(ODD.values()), ids=list(ODD))
def odd_prefix(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    parent = tmp_path / "parent"
    parent.mkdir()
    return parent / str(request.param)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_local_tracker_keeps_its_database_inside_an_odd_prefix(odd_prefix: Path) -> None:
    tracker = LocalTracker(str(odd_prefix))
    issue = tracker.create_issue("odd", "body")
    tracker.create_comment(issue.number, "a comment")
    reader = LocalTracker(str(odd_prefix), readonly=True)
    assert [i.title for i in reader.list_issues()] == ["odd"]
    assert [c.body for c in reader.list_comments(issue.number)] == ["a comment"]
    assert reader.list_repos() == ["local/experiments"]
    assert (odd_prefix / ".marin-tracker" / "tracker.sqlite3").is_file()
    # nothing created beside the prefix (the unescaped URI made SQLite create a truncated path there)
    assert os.listdir(odd_prefix.parent) == [odd_prefix.name]


def _marin(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MARIN_TRACKER": "local", "MARIN_ISSUE_REPO": "lab/odd"}
    return subprocess.run([sys.executable, "-m", "marin", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_plan_run_status_and_dashboard_under_an_odd_prefix(odd_prefix: Path, tmp_path: Path) -> None:
    script = tmp_path / "exp3_odd.py"
    script.write_text(SCRIPT)
    common = ["--prefix", str(odd_prefix), "--backend", "local"]
    plan = _marin(["plan", str(script), *common, "--format", "json"], tmp_path)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert [e["action"] for e in json.loads(plan.stdout)["steps"]] == ["run", "run"]
    assert not odd_prefix.exists()  # plan writes nothing
    run = _marin(["run", str(script), *common], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "publisher" not in run.stderr.lower() or "error" not in run.stderr.lower(), run.stderr[-3000:]
    assert os.listdir(odd_prefix.parent) == [odd_prefix.name]
    total = next((odd_prefix / "demo").glob("total-*"))
    assert (total / "total.txt").read_text().strip() == "6"

    status = _marin(["status", str(script), *common, "--format", "json"], tmp_path)
    assert status.returncode == 0, status.stderr[-3000:]
    doc = json.loads(status.stdout)
    assert doc["prefix"].rstrip("/").endswith(odd_prefix.name)
    assert [s["status"] for s in doc["steps"]] == ["SUCCESS", "SUCCESS"]
    listing = _marin(["status", "--prefix", str(odd_prefix), "--format", "json"], tmp_path)
    assert listing.returncode == 0, listing.stderr[-3000:]
    [experiment] = json.loads(listing.stdout)
    assert experiment["last_run"]["status"] == "SUCCESS" and experiment["issue"] == "lab/odd#3"

    comments = LocalTracker(str(odd_prefix), repo="lab/odd", readonly=True).list_comments(3)
    assert any(experiment["id"] in c.body for c in comments)  # the status comment reached the tracker

    from marin.dashboard import create_app

    with TestClient(create_app(str(odd_prefix), cache_ttl=0)) as c:
        [item] = c.get("/api/experiments").json()["items"]
        assert item["id"] == experiment["id"] and item["state"] == "SUCCESS"
        detail = c.get(f"/api/experiments/{item['id']}").json()
        steps = {s["name"]: s for s in detail["steps"]}
        assert {n: s["status"] for n, s in steps.items()} == {
            "demo/numbers": "SUCCESS", "demo/total": "SUCCESS"}
        step = c.get(f"/api/steps/{quote(steps['demo/total']['path'])}").json()
        assert step["name"] == "demo/total" and step["status"]["status"] == "SUCCESS"
        assert "total=6" in c.get(f"/api/logs/{quote(steps['demo/total']['path'])}").json()["text"]
        issues = c.get("/api/issues").json()
        assert [i["ref"] for i in issues["items"]] == ["lab/odd#3"]
        for url in ("/", f"/experiments/{item['id']}", f"/steps/{quote(steps['demo/total']['path'])}",
                    "/issues/lab/odd/3"):
            assert c.get(url).status_code == 200, url


@pytest.mark.parametrize("value", [*ODD.values(), "a: b", "null", "-x", "'q'", 'say "hi"', "#7"],
                         ids=[*ODD, "colon", "null", "dash", "quotes", "double_quotes", "bare_hash"])
def test_text_flags_are_taken_literally(value: str) -> None:
    """draccus reads values as YAML: ` #1` was a comment (the run wrote to a shorter prefix), `a: b` a
    mapping."""
    from marin.execution.argv import parse_flags

    assert parse_flags(["--prefix", value]).prefix == value
    assert parse_flags([f"--prefix={value}", "--issue", value]).issue == value
    assert parse_flags(["--ray-address", value, "--dry-run"]).ray_address == value
