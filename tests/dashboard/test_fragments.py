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
