"""The experiment page's step graph and table are rendered once per distinct set of steps
(marin/dashboard/fragments.py): an unchanged page reuses them, and a status change on storage is on the very
next page, in the table and the graph."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from marin.dashboard import create_app, fragments
from tests.fakes.synthetic_prefix import write_prefix


def test_fragments_are_reused_until_a_step_changes(tmp_path: Path) -> None:
    write_prefix(str(tmp_path), experiments=1, metrics_rows=5, groups=2)
    app = create_app(str(tmp_path), cache_ttl=0)  # every load revalidates every file
    dash = app.state.dash
    with TestClient(app) as c:
        exp = c.get("/api/experiments").json()["items"][0]["id"]
        first = c.get(f"/experiments/{exp}")
        assert first.status_code == 200 and 'id="steps"' in first.text and 'id="dag"' in first.text
        rendered = fragments._CACHE[(id(dash), exp)][1]
        again = c.get(f"/experiments/{exp}")
        assert again.text == first.text and fragments._CACHE[(id(dash), exp)][1] is rendered  # reused
        step = next(s for s in c.get(f"/api/experiments/{exp}").json()["steps"] if s["status"] == "SUCCESS")
        status_file = tmp_path / step["path"] / ".marin" / "status.json"
        status = json.loads(status_file.read_text())
        status["status"] = "PREEMPTED"
        status_file.write_text(json.dumps(status))
        changed = c.get(f"/experiments/{exp}").text
        assert fragments._CACHE[(id(dash), exp)][1] is not rendered
        row = changed.split(f'<tr data-hash="{step["hash"]}">', 1)[1].split("</tr>", 1)[0]
        assert 'data-field="status">PREEMPTED<' in row
        node = changed.split(f'data-hash="{step["hash"]}" transform', 1)[1].split("</g>", 1)[0]
        assert "PREEMPTED" in node


def test_steps_and_graph_are_built_again_only_when_a_status_read_changed(tmp_path: Path) -> None:
    """`StepViews` (marin/dashboard/experiments.py): every load reads every status.json, and the page's steps
    and laid-out graph are the same objects while those reads and the manifest are; a status changed on
    storage gives new steps and a new graph on the next load, with that status in both."""
    write_prefix(str(tmp_path), experiments=1, metrics_rows=5, groups=2)
    app = create_app(str(tmp_path), cache_ttl=0)  # every load revalidates every file
    index = app.state.dash.experiments
    exp = index.query().items[0].id
    first = index.detail(exp)
    again = index.detail(exp)
    assert first is not None and again is not None and again.steps == first.steps
    assert all(a is b for a, b in zip(again.steps, first.steps, strict=True)) and again.dag is first.dag
    step = next(s for s in first.steps if s.status == "SUCCESS")
    status_file = tmp_path / step.path / ".marin" / "status.json"
    status = json.loads(status_file.read_text())
    status["status"] = "PREEMPTED"
    status_file.write_text(json.dumps(status))
    changed = index.detail(exp)
    assert changed is not None and changed.dag is not first.dag
    assert next(s for s in changed.steps if s.hash == step.hash).status == "PREEMPTED"
    assert next(n for n in changed.dag.nodes if n.hash == step.hash).status == "PREEMPTED"
    assert [s.hash for s in changed.steps] == [s.hash for s in first.steps]
