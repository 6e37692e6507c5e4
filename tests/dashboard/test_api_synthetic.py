"""The JSON API on a synthetic prefix (tests.fakes.synthetic_prefix: every state, shared step names,
metrics)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from tests.fakes.synthetic_prefix import write_experiment


def _exp(client: TestClient, n: int) -> dict:
    items = client.get("/api/experiments", params={"limit": 500}).json()["items"]
    return next(e for e in items if e["id"].endswith(f"-{n:08x}"))


def test_list_is_newest_first_and_paginated(synthetic_client: TestClient) -> None:
    full = synthetic_client.get("/api/experiments", params={"limit": 500}).json()
    assert full["total"] == 12
    created = [e["created"] for e in full["items"]]
    assert created == sorted(created, reverse=True)
    page = synthetic_client.get("/api/experiments", params={"offset": 5, "limit": 5}).json()
    assert [e["id"] for e in page["items"]] == [e["id"] for e in full["items"][5:10]]
    assert page["total"] == 12


def test_filters(synthetic_client: TestClient) -> None:
    get = lambda **p: synthetic_client.get("/api/experiments", params={"limit": 500, **p}).json()  # noqa: E731
    failed = get(state="FAILED")
    assert {e["id"][-8:] for e in failed["items"]} == {f"{0:08x}", f"{10:08x}"}
    assert failed["state_counts"] == {"FAILED": 2, "RUNNING": 2, "SUCCESS": 8}
    assert get(state="RUNNING,FAILED")["total"] == 4
    assert {e["user"] for e in get(author="bob")["items"]} == {"bob"} and get(author="bob")["total"] == 3
    assert get(issue="marin#103")["total"] == 1
    assert get(q="SWEEP 7 (")["total"] == 1 and get(q="sweep 77")["total"] == 0
    # created = 1764000000 + i * 600: all on 2025-11-24 (UTC)
    assert get(since="2025-11-24", until="2025-11-24")["total"] == 12
    assert get(since="2025-11-25")["total"] == 0
    assert synthetic_client.get("/api/experiments", params={"since": "yesterday"}).status_code == 422


def test_experiment_detail_dag_and_counts(synthetic_client: TestClient) -> None:
    exp = _exp(synthetic_client, 0)
    d = synthetic_client.get(f"/api/experiments/{exp['id']}").json()
    assert d["state"] == "FAILED" and not d["active"]
    assert d["step_counts"] == {"SUCCESS": 17, "FAILED": 1, "DEP_FAILED": 2}
    nodes = {n["hash"]: n for n in d["dag"]["nodes"]}
    assert len(nodes) == 20 and len(d["dag"]["edges"]) == 19
    layers = {n["name"].split("/")[1]: n["layer"] for n in nodes.values()}
    assert layers == {"tokenize": 0, "merge": 1, "train": 2, "eval": 3, "report": 4}
    for e in d["dag"]["edges"]:  # every edge points right
        assert nodes[e["source"]]["x"] < nodes[e["target"]]["x"]
    failed = next(s for s in d["steps"] if s["status"] == "FAILED")
    assert failed["name"].endswith("train/model2") and failed["error"]["type"] == "FloatingPointError"


def test_running_experiment_is_active(synthetic_client: TestClient) -> None:
    d = synthetic_client.get(f"/api/experiments/{_exp(synthetic_client, 1)['id']}").json()
    assert d["active"] and d["state"] == "RUNNING"
    assert d["step_counts"] == {"SUCCESS": 5, "RUNNING": 5, "WAITING": 5, "NOT_STARTED": 5}


def test_unknown_experiment_is_404(synthetic_client: TestClient) -> None:
    r = synthetic_client.get("/api/experiments/nope-00000000")
    assert r.status_code == 404 and "nope-00000000" in r.json()["detail"]


def test_step_detail_explains_what_changed(synthetic_client: TestClient) -> None:
    d = synthetic_client.get(f"/api/experiments/{_exp(synthetic_client, 8)['id']}").json()
    train = next(s for s in d["steps"] if s["name"] == "sweep00/train/model0")
    step = synthetic_client.get(f"/api/steps/{train['path']}").json()
    assert step["hash"] == train["hash"] and step["status"]["status"] == "SUCCESS"
    assert step["changes"]["previous"]["path"].startswith("sweep00/train/model0-")  # experiment 4's version
    changes = {c["field"]: c for c in step["changes"]["changes"]}
    assert changes["config.lr"]["old"] == pytest.approx(0.00125) and changes["config.lr"][
        "new"
    ] == pytest.approx(0.0015)
    assert changes["config.seed"]["old"] == 4 and changes["config.seed"]["new"] == 8
    assert set(changes) == {"config.lr", "config.seed"}
    ev = next(s for s in d["steps"] if s["name"] == "sweep00/eval/model0")
    ev_changes = {
        c["field"] for c in synthetic_client.get(f"/api/steps/{ev['path']}").json()["changes"]["changes"]
    }
    assert "dependency sweep00/train/model0" in ev_changes
    assert "dependency sweep00/train/model0: config.lr" in ev_changes


def test_step_events_attempts_and_log(synthetic_client: TestClient) -> None:
    d = synthetic_client.get(f"/api/experiments/{_exp(synthetic_client, 0)['id']}").json()
    failed = next(s for s in d["steps"] if s["status"] == "FAILED")
    step = synthetic_client.get(f"/api/steps/{failed['path']}").json()
    assert [e["event"] for e in step["events"]] == ["WAITING", "RUNNING", "FAILED"]
    assert step["attempts"][0]["outcome"] == "FAILED" and step["attempts"][0]["log"].endswith("attempt-1.log")
    tail = synthetic_client.get(f"/api/logs/{failed['path']}").json()
    assert tail["attempt"] == 1 and tail["text"].startswith("[train] line 0") and not tail["truncated"]
    dep = next(s for s in d["steps"] if s["status"] == "DEP_FAILED")
    dep_step = synthetic_client.get(f"/api/steps/{dep['path']}").json()
    assert dep_step["status"]["error"]["type"] == "DependencyFailed"
    empty = synthetic_client.get(f"/api/logs/{dep['path']}").json()
    assert empty["path"] is None and empty["text"] == ""


def test_metrics_curves_expert_load_and_eval(synthetic_client: TestClient) -> None:
    d = synthetic_client.get(f"/api/experiments/{_exp(synthetic_client, 2)['id']}").json()
    train = next(s for s in d["steps"] if s["name"].endswith("train/model1"))
    m = synthetic_client.get(f"/api/metrics/{train['path']}").json()
    assert m["rows"] == 60 and len(m["steps"]) == 60 and not m["downsampled"]
    assert {"loss", "lr", "grad_norm", "update_norm"} <= set(m["series"])
    assert m["series"]["loss"][0] > m["series"]["loss"][-1]
    assert len(m["expert_load"]["layers"]) == 4 and len(m["expert_load"]["layers"][0]) == 8
    assert [p["step"] for p in m["eval_history"]] == [10, 20, 30, 40, 50]
    small = synthetic_client.get(f"/api/metrics/{train['path']}", params={"max_points": 7}).json()
    assert (
        small["downsampled"]
        and len(small["steps"]) == 7
        and small["steps"][-1] == 59
        and small["steps"][0] == 0
    )
    ev = next(s for s in d["steps"] if s["name"].endswith("eval/model1"))
    em = synthetic_client.get(f"/api/metrics/{ev['path']}").json()
    assert set(em["eval"]["domains"]) == {"python", "prose", "math"} and em["rows"] == 0
    tok = next(s for s in d["steps"] if "tokenize" in s["name"])
    assert synthetic_client.get(f"/api/metrics/{tok['path']}").status_code == 404


def test_files_listing_and_preview(synthetic_client: TestClient) -> None:
    d = synthetic_client.get(f"/api/experiments/{_exp(synthetic_client, 2)['id']}").json()
    train = next(s for s in d["steps"] if s["name"].endswith("train/model1"))
    listing = synthetic_client.get(f"/api/files/{train['path']}").json()
    names = {e["name"]: e["type"] for e in listing["entries"]}
    assert names[".marin"] == "directory" and names["metrics.jsonl"] == "file"
    preview = synthetic_client.get(f"/api/files/{train['path']}/.marin/step.json").json()
    assert preview["type"] == "file" and json.loads(preview["text"])["hash"] == train["hash"]
    assert synthetic_client.get(f"/api/files/{train['path']}/missing.txt").status_code == 404


def test_openapi_documents_typed_api(synthetic_client: TestClient) -> None:
    spec = synthetic_client.get("/openapi.json").json()
    paths = spec["paths"]
    for p in (
        "/api/experiments",
        "/api/experiments/{experiment_id}",
        "/api/steps/{step_path}",
        "/api/logs/{step_path}",
        "/api/metrics/{step_path}",
        "/api/files/{file_path}",
        "/api/issues",
    ):
        assert p in paths, p
    ok = paths["/api/experiments"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/ExperimentList")
    assert {"q", "state", "issue", "author", "since", "until", "offset", "limit"} <= {
        p["name"] for p in paths["/api/experiments"]["get"]["parameters"]
    }
    assert not any(p.startswith("/experiments") or p == "/" for p in paths)  # HTML pages are not API


def test_pages_render(synthetic_client: TestClient) -> None:
    exp = _exp(synthetic_client, 0)
    d = synthetic_client.get(f"/api/experiments/{exp['id']}").json()
    page = synthetic_client.get(f"/experiments/{exp['id']}").text
    assert page.count('class="node state-') == 20 and 'class="node state-FAILED"' in page
    train = next(s for s in d["steps"] if s["name"].endswith("train/model1"))
    step_page = synthetic_client.get(f"/steps/{train['path']}").text
    assert 'id="chart-loss"' in step_page and 'data-metrics="true"' in step_page
    listing = synthetic_client.get("/", params={"state": "FAILED"}).text
    assert listing.count("<tr data-id=") == 2
    assert synthetic_client.get("/", params={"since": "nope"}).status_code == 400
    assert synthetic_client.get("/experiments/missing-00000000").status_code == 404


def test_changes_are_seen_through_the_cache(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    exp_id = write_experiment(prefix, 1, metrics_rows=5)
    with TestClient(create_app(prefix, cache_ttl=0)) as c:
        d = c.get(f"/api/experiments/{exp_id}").json()
        running = next(s for s in d["steps"] if s["status"] == "RUNNING")
        status_path = tmp_path / running["path"] / ".marin/status.json"
        status = json.loads(status_path.read_text())
        status.update(status="SUCCESS", ended=status["started"] + 3)
        status_path.write_text(json.dumps(status))
        d2 = c.get(f"/api/experiments/{exp_id}").json()
        assert next(s for s in d2["steps"] if s["hash"] == running["hash"])["status"] == "SUCCESS"
        write_experiment(prefix, 2, metrics_rows=5)
        assert c.get("/api/experiments").json()["total"] == 2
        # metrics.jsonl grows while training: only the new rows are read, and they show up
        metrics = tmp_path / running["path"] / "metrics.jsonl"
        before = c.get(f"/api/metrics/{running['path']}").json()["rows"]
        with metrics.open("a") as f:
            f.write(json.dumps({"step": 99, "loss": 1.0, "lr": 0.1}) + "\n" + '{"step": 100, "lo')
        after = c.get(f"/api/metrics/{running['path']}").json()
        assert after["rows"] == before + 1 and after["steps"][-1] == 99
        with metrics.open("a") as f:
            f.write('ss": 0.5, "lr": 0.1}\n')
        assert c.get(f"/api/metrics/{running['path']}").json()["steps"][-1] == 100


def test_large_log_is_tailed_and_followed(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    exp_id = write_experiment(prefix, 2, metrics_rows=5)
    with TestClient(create_app(prefix, cache_ttl=0)) as c:
        step = c.get(f"/api/experiments/{exp_id}").json()["steps"][0]
        log = tmp_path / step["path"] / ".marin/logs/attempt-1.log"
        log.write_bytes(b"x" * (3 << 20) + b"\nTHE END\n")
        tail = c.get(f"/api/logs/{step['path']}", params={"max_bytes": 4096}).json()
        assert tail["size"] == (3 << 20) + 9 and tail["truncated"] and len(tail["text"]) == 4096
        assert tail["text"].endswith("THE END\n") and tail["end"] == tail["size"]
        with log.open("ab") as f:
            f.write("more ✓\n".encode())
        follow = c.get(f"/api/logs/{step['path']}", params={"offset": tail["end"]}).json()
        assert follow["text"] == "more ✓\n" and follow["start"] == tail["end"]
        raw = c.get(f"/raw/{step['path']}/.marin/logs/attempt-1.log")
        assert len(raw.content) == (3 << 20) + 9 + len("more ✓\n".encode())


def test_memory_filesystem_prefix(synthetic_prefix: Path) -> None:
    """A non-local fsspec backend goes through the same code (signatures from the backend's info())."""
    fs = fsspec.filesystem("memory")
    fs.put(str(synthetic_prefix), "/dash-test", recursive=True)
    try:
        with TestClient(create_app("memory://dash-test", cache_ttl=0)) as c:
            listing = c.get("/api/experiments", params={"limit": 500}).json()
            assert listing["total"] == 12 and not listing["problems"]
            d = c.get(f"/api/experiments/{listing['items'][0]['id']}").json()
            assert "NOT_STARTED" not in d["step_counts"] or d["state"] == "RUNNING"
            step = c.get(f"/api/steps/{d['steps'][5]['path']}").json()
            assert step["events"] and step["changes"]["note"]
            assert c.get(f"/api/logs/{d['steps'][5]['path']}").json()["size"] > 0
    finally:
        fs.rm("/dash-test", recursive=True)


def test_oversized_or_corrupt_json_is_reported_not_loaded(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    exp_id = write_experiment(prefix, 2, metrics_rows=2)
    (tmp_path / "experiments" / "broken-00000000.json").write_text("{not json")
    with TestClient(create_app(prefix, cache_ttl=0), raise_server_exceptions=False) as c:
        listing = c.get("/api/experiments").json()
        assert listing["total"] == 1
        assert any("broken-00000000.json" in p for p in listing["problems"])
        assert "broken-00000000.json" in c.get("/").text  # the list page shows the problem
        step = c.get(f"/api/experiments/{exp_id}").json()["steps"][0]
        huge = tmp_path / step["path"] / ".marin/step.json"
        with huge.open("w") as f:
            f.write('{"pad": "' + "x" * (17 << 20) + '"}')
        r = c.get(f"/api/steps/{step['path']}")
        # issue 32: one problem named on the page, never a whole-page 500
        assert r.status_code == 200 and any("does not load it" in p for p in r.json()["problems"])
