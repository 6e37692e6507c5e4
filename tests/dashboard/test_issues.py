"""Local tracker issues on the dashboard: a real run publishes its status comment, the dashboard shows it."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from marin.dashboard import create_app

from .conftest import IMG, XSS


def test_local_issue_with_status_comment(run_marin: Any, marin_prefix: str) -> None:
    from marin import Step, output_path_of, this_output_path
    from marin.tracking.local import LocalTracker
    from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers

    tracker = LocalTracker(marin_prefix)
    issue = tracker.create_issue(
        f"Try numbers {XSS}", f"Hypothesis: {IMG}\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    )
    numbers = Step(
        name="demo/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=4)
    )
    total = Step(
        name="demo/total",
        fn=sum_numbers,
        config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"), output_path=this_output_path()),
    )
    result = run_marin([total], issue=issue.ref, description="numbers for the issue")
    assert result.status == "SUCCESS"

    with TestClient(create_app(marin_prefix, cache_ttl=0)) as c:
        issues = c.get("/api/issues").json()
        assert issues["available"] and [i["ref"] for i in issues["items"]] == [issue.ref]
        item = issues["items"][0]
        assert "marin:succeeded" in item["labels"] and item["url"] == f"/issues/{issue.repo}/{issue.number}"
        status_comments = [cm for cm in item["comments"] if "marin-status" in cm["body"]]
        assert len(status_comments) == 1 and result.experiment_id in status_comments[0]["body"]

        detail = c.get(f"/api/issues/{issue.repo}/{issue.number}").json()
        assert detail["experiments"] == [result.experiment_id] and detail["title"] == f"Try numbers {XSS}"
        exp = c.get("/api/experiments").json()["items"][0]
        assert exp["issue"] == {
            "ref": issue.ref,
            "url": f"/issues/{issue.repo}/{issue.number}",
            "local": True,
        }

        page = c.get(f"/issues/{issue.repo}/{issue.number}").text
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "Try numbers &lt;script&gt;" in page
        assert (
            page.count('<table class="list md"') >= 2
        )  # the body's table and the status comment's step table
        assert "marin-status" not in page  # the hidden marker stays hidden
        assert f'href="/experiments/{result.experiment_id}"' in page
        assert "demo/total" in page
        listing = c.get("/issues").text
        assert issue.ref in listing and "Try numbers &lt;script&gt;" in listing

        # a new comment shows up (the cache keys on the database file's signature)
        tracker.create_comment(issue.number, "a human comment")
        again = c.get(f"/api/issues/{issue.repo}/{issue.number}").json()
        assert again["comments"][-1]["body"] == "a human comment"
        assert c.get(f"/api/issues/{issue.repo}/999").status_code == 404


def test_prefix_without_tracker(synthetic_client: TestClient) -> None:
    assert synthetic_client.get("/api/issues").json() == {"available": False, "items": []}
    assert "no local issue tracker" in synthetic_client.get("/issues").text
    assert synthetic_client.get("/api/issues/local/experiments/1").status_code == 404
