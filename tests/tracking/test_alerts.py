"""Alerts on the local issue and the dashboard: debounce (1,000 firing steps make one comment and one
resolution), restarts without duplicates, the blind watcher, an attempt that ended with an alert open, risk
points, and hostile text escaped. The events are written by the trainer's own Watcher (no training)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from marin.status.publisher import RunView, StepView
from marin.tracking.alerts import POSTED_FILE, AlertPoster
from marin.tracking.local import LocalTracker
from moe_trainer.watch import DropRate, RiskPoint, RunFacts, WatchConfig, Watcher
from tests.fakes.synthetic_prefix import write_prefix

FACTS = RunFacts(num_steps=2000, update_window=128, skip_nonfinite=True, max_grad_norm=1.0, n_experts=8,
                 top_k=2, capacity_factor=1.25)
XSS = "<script>alert('xss')</script>"


def row(step: int, **kw: Any) -> dict[str, Any]:
    return {"step": step, "loss": 2.0, "grad_norm": 0.5, "update_norm": 0.1, "tokens_per_s": 1000.0,
            "drop_rate": 0.01, "update_filter_armed": True, **kw}


def view(prefix: Path, out: Path, status: str = "RUNNING", started: float | None = None) -> RunView:
    now = time.time()
    step = StepView(name="train/moe", hash="cafe0123" + "0" * 56, output_path=str(out), status=status,
                    attempt=1, started=started or now - 30, ended=None if status == "RUNNING" else now,
                    error_summary=None, log_path=None, dependencies=())
    return RunView(experiment_id="exp17_health-cafe0123", run_id="r1", script="experiments/exp17.py",
                   description="health", issue="local/health#1", prefix=str(prefix),
                   status="RUNNING" if status == "RUNNING" else "FAILED", started=now - 60, ended=None,
                   steps=(step,))


@pytest.fixture
def issue(tmp_path: Path) -> LocalTracker:
    tracker = LocalTracker(str(tmp_path), "local/health")
    tracker.create_issue("health", "alerts land here")
    return tracker


def bodies(tracker: LocalTracker) -> list[str]:
    return [c.body for c in tracker.list_comments(1)]


def test_1000_firing_steps_make_one_comment_and_one_resolution(tmp_path: Path, issue: LocalTracker) -> None:
    out = tmp_path / "train-cafe0123"
    w = Watcher(WatchConfig(), str(out), FACTS)
    poster = AlertPoster(issue, 1, dashboard_url="http://dash")
    for step in range(1, 1101):
        w.observe(row(step, drop_rate=0.3 if step <= 1000 else 0.0))
        if step % 50 == 0:  # the publisher polls while the step runs
            poster.poll(view(tmp_path, out))
    poster.poll(view(tmp_path, out))
    got = bodies(issue)
    assert len(got) == 2, got
    assert got[0].startswith("<!-- marin-alert:cafe0123:") and "Alert: `drop_rate`" in got[0]
    assert "**Where:** step 5 · attempt 1" in got[0] and "**Since:** step 1" in got[0]
    assert "http://dash/steps/train-cafe0123" in got[0] and "`drop_rate` 0.3" in got[0]
    assert "Resolved: `drop_rate`" in got[1] and "the condition cleared at step 1003" in got[1]
    # a restarted executor (a new poster) posts nothing again; nor does one that lost the posted record
    assert AlertPoster(issue, 1).poll(view(tmp_path, out)) == 0
    assert len(json.loads((out / POSTED_FILE).read_text())["issues"]["local/health#1"]) == 2
    (out / POSTED_FILE).unlink()
    AlertPoster(issue, 1).poll(view(tmp_path, out))
    assert len(bodies(issue)) == 2


def test_an_attempt_that_ended_with_an_alert_open(tmp_path: Path, issue: LocalTracker) -> None:
    out = tmp_path / "train-cafe0123"
    w = Watcher(WatchConfig(drop_rate=DropRate(pending_steps=1)), str(out), FACTS)
    w.observe(row(1, drop_rate=0.5))  # the process dies here: nothing resolves the alert in the file
    AlertPoster(issue, 1).poll(view(tmp_path, out, status="FAILED"))
    got = bodies(issue)
    assert len(got) == 2 and "the attempt ended (FAILED) with this alert open" in got[1]


def test_blind_watcher_is_posted_once_and_resolved(tmp_path: Path, issue: LocalTracker) -> None:
    out = tmp_path / "train-cafe0123"
    now = [time.time()]
    w = Watcher(WatchConfig(heartbeat_s=1.0, blind_after_s=5.0), str(out), FACTS, clock=lambda: now[0])
    w.observe(row(1))
    seen = [now[0] + 10]  # the publisher looks ten seconds later: no heartbeat since
    poster = AlertPoster(issue, 1, clock=lambda: seen[0])
    poster.poll(view(tmp_path, out))
    poster.poll(view(tmp_path, out))
    (blind,) = bodies(issue)
    assert "Alert: `watcher_blind`" in blind and "no heartbeat for 10 s" in blind
    now[0] += 10
    w.tick()  # the heartbeat resumes
    seen[0] = now[0] + 1
    poster.poll(view(tmp_path, out))
    assert "Resolved: `watcher_blind`" in bodies(issue)[1] and "the heartbeat resumed" in bodies(issue)[1]
    assert len(bodies(issue)) == 2


def test_risk_point_failure_is_posted_with_its_plan_and_text_escaped(tmp_path: Path,
                                                                    issue: LocalTracker) -> None:
    out = tmp_path / "train-cafe0123"
    cfg = WatchConfig(risk_points=(RiskPoint("quarter", at_step=10, below=1.0, action=f"retreat {XSS}"),
                                   RiskPoint("early", at_step=5, below=3.0)))
    w = Watcher(cfg, str(out), FACTS)
    for step in range(1, 12):
        w.observe(row(step))
    AlertPoster(issue, 1).poll(view(tmp_path, out))
    (failed,) = bodies(issue)  # the passed point is not posted
    assert "Risk point failed: `risk:quarter`" in failed and "retreat &lt;script&gt;" in failed
    assert "<script>" not in failed


@pytest.fixture(scope="module")
def dashboard_prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A synthetic prefix whose first step carries an active alert and a failed risk point with hostile text,
    written by the trainer's Watcher."""
    prefix = tmp_path_factory.mktemp("dash-alerts")
    write_prefix(str(prefix), experiments=1, metrics_rows=5, groups=1)
    manifest = json.loads(next((prefix / "experiments").glob("*.json")).read_text())
    step = next(s for s in manifest["steps"] if "/train/" in s["name"])
    out = Path(step["output_path"])
    status = json.loads((out / ".marin/status.json").read_text())
    (out / ".marin/status.json").write_text(json.dumps({**status, "status": "RUNNING"}))
    cfg = WatchConfig(drop_rate=DropRate(pending_steps=1),
                      risk_points=(RiskPoint(XSS, at_step=2, below=1.0, action=f"plan {XSS}"),))
    w = Watcher(cfg, str(out), FACTS)
    for s in range(1, 4):
        w.observe(row(s, drop_rate=0.4))
    return prefix, str(out.relative_to(prefix))


def test_dashboard_lists_active_alerts_escaped(dashboard_prefix: tuple[Path, str]) -> None:
    prefix, rel = dashboard_prefix
    with TestClient(create_app(str(prefix), cache_ttl=0)) as client:
        page = client.get("/alerts")
        assert page.status_code == 200
        assert "drop_rate" in page.text and f'href="/steps/{rel}"' in page.text
        assert "<script>alert" not in page.text and "&lt;script&gt;" in page.text
        api = client.get("/api/alerts").json()["active"]
        assert {a["rule"] for a in api} == {"drop_rate", f"risk:{XSS}"}
        step_page = client.get(f"/steps/{rel}")
        assert step_page.status_code == 200 and 'id="alerts-section"' in step_page.text
        assert "<script>alert" not in step_page.text and "failed" in step_page.text
        detail = client.get(f"/api/alerts/{rel}").json()
        assert detail["status"] == "RUNNING" and detail["alerts"][0]["active"]


def _status_comment(tracker: LocalTracker) -> str:
    (status,) = [b for b in bodies(tracker) if b.startswith("<!-- marin-status:")]
    return status


def test_status_comment_lists_active_alerts_and_counts_resolved_ones(tmp_path: Path,
                                                                     issue: LocalTracker) -> None:
    """The publisher's status comment on a local issue: one row per active alert (rule, severity, since,
    values), the resolved ones counted by rule, hostile text inert; a resolution updates it."""
    from marin.tracking.publisher import IssuePublisher

    out = tmp_path / "train-cafe0123"
    hostile = f"{XSS} @octocat | `x`"
    cfg = WatchConfig(drop_rate=DropRate(pending_steps=1, resolve_steps=1),
                      risk_points=(RiskPoint(hostile, at_step=3, below=1.0, action=f"plan {XSS}"),))
    w = Watcher(cfg, str(out), FACTS)
    for step in range(1, 6):  # drop_rate fires at 1, resolves at 2, fires again at 4
        w.observe(row(step, drop_rate=0.5 if step in (1, 4, 5) else 0.0))
    publisher = IssuePublisher(issue, 1, min_interval_s=0)
    publisher.publish(view(tmp_path, out), final=True)
    status = _status_comment(issue)
    section = status.split("#### Alerts", 1)[1]
    assert section.startswith(" (2 active, 1 resolved)")
    rows = [line for line in section.splitlines() if line.startswith("| `train/moe` |")]
    assert len(rows) == 2
    risk, drop = rows  # critical first
    assert "risk point failed" in risk and "&lt;script&gt;" in risk and "@\u200doctocat" in risk
    assert "drop_rate" in drop and "🟠 warning" in drop and "step 4, " in drop and "drop_rate 0.5" in drop
    assert "<script>" not in status and "@octocat" not in status
    assert all(line.count(" | ") == 5 for line in rows)  # hostile `|` and backticks cannot split the row
    assert "- `train/moe`: 1 resolved (drop_rate 1)" in section
    # the step ends and its watcher closes: nothing is active any more, both firings counted as resolved
    w.close()
    IssuePublisher(issue, 1, min_interval_s=0).publish(view(tmp_path, out, status="FAILED"), final=True)
    section = _status_comment(issue).split("#### Alerts", 1)[1]
    assert section.startswith(" (1 active, 2 resolved)")  # the failed risk point stays on the record
    assert "drop_rate 2" in section


def test_dashboard_alert_history_keeps_resolved_alerts(tmp_path: Path) -> None:
    """A rule that fired and resolved leaves the active list but stays in the history, with its resolution,
    its rule and the experiment naming the step; the filters select by rule, run and state."""
    prefix = tmp_path / "prefix"
    write_prefix(str(prefix), experiments=2, metrics_rows=5, groups=2)
    manifests = [json.loads(p.read_text()) for p in sorted((prefix / "experiments").glob("*.json"))]
    step = next(s for s in manifests[0]["steps"] if "/train/" in s["name"])
    out = Path(step["output_path"])
    w = Watcher(WatchConfig(drop_rate=DropRate(pending_steps=1)), str(out), FACTS)
    for s in range(1, 4):
        w.observe(row(s, drop_rate=0.4))
    for s in range(4, 8):
        w.observe(row(s, drop_rate=0.0))  # back under the threshold: resolved
    w.close()
    rel = str(out.relative_to(prefix))
    with TestClient(create_app(str(prefix), cache_ttl=0)) as client:
        doc = client.get("/api/alerts").json()
        assert doc["active"] == []
        (entry,) = [h for h in doc["history"] if h["rule"] == "drop_rate"]
        assert entry["resolved"] is not None and entry["resolved"]["step"] >= 4 and entry["step"] >= 1
        assert entry["step_path"] == rel and entry["experiments"] == [manifests[0]["id"]]
        assert client.get("/api/alerts", params={"state": "active"}).json()["history"] == []
        assert client.get("/api/alerts", params={"rule": "nope"}).json()["history"] == []
        assert len(client.get("/api/alerts", params={"run": manifests[0]["id"]}).json()["history"]) == 1
        assert client.get("/api/alerts", params={"run": manifests[1]["id"]}).json()["history"] == []
        page = client.get("/alerts", params={"state": "resolved"}).text
        assert 'data-rule="drop_rate" data-state="resolved"' in page and "no active alerts" in page
