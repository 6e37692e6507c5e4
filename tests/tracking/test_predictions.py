"""The engine's side of pre-registered predictions: posting a record once (never edited) and its receipt,
"on track / off track" in the status comment, the calibration listing, the CLI and the dashboard page."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from marin.status.publisher import RunView, StepView
from marin.tracking.local import LocalTracker
from marin.tracking.predictions import PredictionPublisher, list_predictions, tracking_section
from marin.tracking.predictions_cli import main as predictions_main
from openlab_records import POSTED_FILE, is_sealed, record_hash, seal

POINTS = [
    {"label": "50%", "step": 50, "point": 2.0, "low": 1.9, "high": 2.1},
    {"label": "100%", "step": 100, "point": 1.5, "low": 1.45, "high": 1.55},
]


def _record() -> dict[str, Any]:
    return seal(
        {
            "schema": "marin-prediction/v1",
            "experiment": "exp15",
            "issue": "local/experiments#15",
            "metric": {"name": "micro.bpb", "path": "eval.micro.bpb"},
            "points": POINTS,
            "target": {"name": "d56-L3", "config_hash": "c" * 64},
            "assumptions": ["one law"],
        }
    )


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _view(prefix: Path, *steps: tuple[str, str, str]) -> RunView:
    views = tuple(
        StepView(
            name=n,
            hash="h" * 64,
            output_path=str(prefix / p),
            status=s,
            attempt=1,
            started=1.0,
            ended=None,
            error_summary=None,
            log_path=None,
            dependencies=(),
        )
        for n, p, s in steps
    )
    return RunView(
        experiment_id="exp15-abc",
        run_id="r1",
        script="exp15.py",
        description="",
        issue=None,
        prefix=str(prefix),
        status="RUNNING",
        started=time.time(),
        ended=None,
        steps=views,
    )


def test_operator_and_engine_hash_records_the_same_way() -> None:
    record = _record()  # sealed by the one writer both sides import (openlab_records)
    assert record["record_sha256"] == record_hash(record) and is_sealed(record)
    assert not is_sealed({**record, "points": POINTS[:1]})


def test_prediction_is_posted_once_as_its_own_comment_with_a_receipt(tmp_path: Path) -> None:
    tracker = LocalTracker(str(tmp_path), "local/experiments")
    publisher = PredictionPublisher(tracker, 15)
    record = _record()
    _write(tmp_path / "exp15/prediction-1/prediction.json", record)
    view = _view(tmp_path, ("exp15/prediction", "exp15/prediction-1", "SUCCESS"))
    publisher.publish(view, final=False)
    comments = tracker.list_comments(15)  # the issue was created in the fresh local tracker
    assert len(comments) == 1
    body = comments[0].body
    assert body.startswith(f"<!-- marin-prediction:{record['record_sha256']} -->")
    assert record["record_sha256"] in body and "never edited" in body and "[1.4500, 1.5500]" in body
    receipt = json.loads((tmp_path / "exp15/prediction-1" / POSTED_FILE).read_text())
    assert receipt["record_sha256"] == record["record_sha256"] and receipt["comment_id"] == comments[0].id
    PredictionPublisher(tracker, 15).publish(view, final=True)  # a restarted run finds the comment
    assert len(tracker.list_comments(15)) == 1
    assert tracker.list_comments(15)[0].updated == comments[0].created  # never edited


def test_a_tampered_prediction_is_not_posted(tmp_path: Path) -> None:
    tracker = LocalTracker(str(tmp_path), "local/experiments")
    tracker.ensure_issue(15, title="t", body="b")
    _write(tmp_path / "p/prediction.json", {**_record(), "points": POINTS[:1]})
    with pytest.raises(ValueError, match="edited after it was written"):
        PredictionPublisher(tracker, 15).publish(
            _view(tmp_path, ("exp15/prediction", "p", "SUCCESS")), final=False
        )
    assert tracker.list_comments(15) == [] and not (tmp_path / "p" / POSTED_FILE).exists()


def _tracked(tmp_path: Path, actual_50: float | None, actual_100: float | None) -> None:
    record = _record()
    _write(tmp_path / "pred/prediction.json", record)
    _write(
        tmp_path / "target/tracking.json",
        {
            "schema": "marin-tracking/v1",
            "prediction": str(tmp_path / "pred/prediction.json"),
            "record_sha256": record["record_sha256"],
            "metrics_file": "metrics.jsonl",
            "metric_path": "eval.micro.bpb",
        },
    )
    rows = [{"step": 10, "loss": 3.0}]
    rows += [{"step": 50, "eval": {"micro": {"bpb": actual_50}}}] if actual_50 is not None else []
    rows += [{"step": 100, "eval": {"micro": {"bpb": actual_100}}}] if actual_100 is not None else []
    (tmp_path / "target/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_status_comment_says_on_track_and_off_track_as_evaluations_land(tmp_path: Path) -> None:
    _tracked(tmp_path, 2.05, None)
    lines = "\n".join(tracking_section(_view(tmp_path, ("exp15/target/train", "target", "RUNNING")).steps))
    assert "on track (inside the 90% interval): actual 2.0500, predicted 2.0000" in lines
    assert "| 100% | 100 | 1.5000 | [1.4500, 1.5500] | — | pending |" in lines
    _tracked(tmp_path, 2.05, 1.6)
    lines = "\n".join(tracking_section(_view(tmp_path, ("exp15/target/train", "target", "SUCCESS")).steps))
    # (predicted - actual) / actual = (1.5 - 1.6) / 1.6: the run came in above the forecast: negative
    assert "off track by -6.25% (outside the 90% interval): actual 1.6000" in lines


def _verdict(prediction: dict[str, Any], actual: float) -> dict[str, Any]:
    end = {
        **POINTS[-1],
        "actual": actual,
        "error_pct": 100 * (1.5 - actual) / actual,
        "inside": 1.45 <= actual <= 1.55,
    }
    return seal(
        {
            "schema": "marin-verdict/v1",
            "prediction_sha256": prediction["record_sha256"],
            "metric": "micro.bpb",
            "target": "d56-L3",
            "points": [end],
            "hits": int(end["inside"]),
            "n": 1,
            "experiment": "exp15",
            "issue": "local/experiments#15",
        }
    )


def test_calibration_listing_pairs_verdicts_and_flags_tampering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _record()
    _write(tmp_path / "a/prediction/prediction.json", good)
    _write(tmp_path / "a/verdict/verdict.json", _verdict(good, 1.52))
    _write(tmp_path / "b/prediction/prediction.json", {**good, "points": POINTS[:1]})
    listing = list_predictions(str(tmp_path))
    rows = {r["path"].split("/")[-3]: r for r in listing["predictions"]}
    assert rows["a"]["verified"] and rows["a"]["inside"] is True and rows["a"]["actual"] == 1.52
    assert rows["b"]["verified"] is False
    assert listing["scored"] == 1 and listing["hit_rate"] == 1.0
    assert predictions_main(["--prefix", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TAMPERED" in out and "inside" in out and "90% intervals hit 100%" in out


def test_an_edited_verdict_is_paired_with_its_prediction_and_listed_as_not_verified(tmp_path: Path) -> None:
    good = _record()
    _write(tmp_path / "a/prediction/prediction.json", good)
    edited = _verdict(good, 1.52)
    edited["points"][0]["actual"] = 1.5201  # after sealing: neither its hash nor its error_pct match now
    _write(tmp_path / "a/verdict/verdict.json", edited)
    [row] = list_predictions(str(tmp_path))["predictions"]
    assert row["verified"] and row["verdict_path"] == str(tmp_path / "a/verdict/verdict.json")
    assert row["verdict_verified"] is False and row["actual"] is None and row["inside"] is None


def test_dashboard_lists_predictions_with_their_verdicts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app

    good = _record()
    _write(tmp_path / "a/prediction/prediction.json", good)
    _write(tmp_path / "a/verdict/verdict.json", _verdict(good, 1.6))
    client = TestClient(create_app(str(tmp_path)))
    api = client.get("/api/predictions").json()
    assert api["hit_rate"] == 0.0 and api["predictions"][0]["sha256"] == good["record_sha256"]
    page = client.get("/predictions")
    assert page.status_code == 200 and good["record_sha256"][:12] in page.text and "outside" in page.text


def test_status_comment_refreshes_when_an_evaluation_lands_between_transitions(tmp_path: Path) -> None:
    from marin.tracking.publisher import IssuePublisher

    tracker = LocalTracker(str(tmp_path), "local/experiments")
    tracker.ensure_issue(15, title="t", body="b")
    _tracked(tmp_path, None, None)
    publisher = IssuePublisher(tracker, 15, min_interval_s=0.05)
    view = _view(tmp_path, ("exp15/target/train", "target", "RUNNING"))

    def status_body() -> str:
        return next(c.body for c in tracker.list_comments(15) if c.body.startswith("<!-- marin-status:"))

    publisher.publish(view, final=False)
    deadline = time.time() + 30
    while not any(c.body.startswith("<!-- marin-status:") for c in tracker.list_comments(15)):
        assert time.time() < deadline
        time.sleep(0.1)
    assert "no evaluation yet" in status_body()
    _tracked(tmp_path, 2.3, None)  # the 50% evaluation lands; no state transition happens
    while "off track by -13.04%" not in status_body():  # (2.0 - 2.3) / 2.3
        assert time.time() < deadline, status_body()
        time.sleep(0.2)
    publisher.publish(dataclasses.replace(view, status="SUCCESS"), final=True)


def test_every_listing_surface_marks_fired_gates_and_the_old_interval_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import markupsafe
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app
    from marin.tracking.predictions import prediction_body
    from openlab_records import Prediction

    old = _record()  # no interval_rules: made before issue 34
    body = {k: v for k, v in old.items() if k != "record_sha256"}
    new = seal({**body, "warnings": ["the top rung left the law"],
                "interval_rules": "issue-34/3", "gates_flagged": ["backtest_top_rung"]})
    _write(tmp_path / "old/prediction/prediction.json", old)
    _write(tmp_path / "new/prediction/prediction.json", new)
    rows = {r["path"].split("/")[-3]: r for r in list_predictions(str(tmp_path))["predictions"]}
    rules = Prediction.from_json(old).rules_line()
    assert rules and rows["old"]["rules_line"] == rules and rows["old"]["gates_flagged"] == []
    assert rows["new"]["rules_line"] is None and rows["new"]["gates_flagged"] == ["backtest_top_rung"]
    assert predictions_main(["--prefix", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gates fired before the run: backtest_top_rung" in out and rules in out
    page = TestClient(create_app(str(tmp_path))).get("/predictions").text
    assert "gates fired: backtest_top_rung" in page and str(markupsafe.escape(rules)) in page
    comment = prediction_body(Prediction.from_json(new))
    assert "⚠️ gates fired (backtest_top_rung)" in comment and rules not in comment
    assert rules in prediction_body(Prediction.from_json(old))
    # a record made under issue 34's first rules says so too, with its own line
    first = Prediction.from_json(seal({**body, "interval_rules": "issue-34"})).rules_line()
    assert first and first != rules and "first interval rules" in first
    # and one made under the second (the 0.75% floor), with its own line
    second = Prediction.from_json(seal({**body, "interval_rules": "issue-34/2"})).rules_line()
    assert second and second not in (first, rules) and "0.75% per decade" in second
