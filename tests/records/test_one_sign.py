"""One record through every surface: the verdict, its issue comment, the status comment's tracking lines, the
dashboard (step page and calibration API), ``marin predictions`` and the target's health alert all state the
same forecast error, in the same sign: ``(predicted - actual) / actual``.

The prediction is a v1 record written by the old writer (tests/fakes/records_v1); the target's curve lands
2% above the forecast at the end (outside the interval), so every surface must say -1.96%."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jinja2
import pytest
from fastapi.testclient import TestClient

import marin.dashboard
from marin.dashboard.app import create_app
from marin.dashboard.predictions import for_step
from marin.tracking.predictions import tracking_section, verdict_body
from marin.tracking.predictions_cli import main as predictions_main
from moe_trainer.health_rules import History, RunFacts
from moe_trainer.jsonio import write_json_atomic
from openlab_records import PREDICTION_FILE, Prediction, Tracking, Verdict, read_sealed
from operators.scaling.band import eval_band
from operators.scaling.curve import CURVE_FILE
from operators.scaling.verdict import VerdictConfig, score_prediction
from tests.tracking.test_predictions import _view

V1 = Path(__file__).resolve().parents[1] / "fakes" / "records_v1" / "prediction-law.json"
FACTOR = (1.0, 1.0, 1.0, 1.02)  # the run's actual value over the forecast, per point


def scored_ladder(tmp_path: Path, factors: tuple[float, ...] = FACTOR) -> Path:
    """The v1 record under ``tmp_path/exp``, a target whose curve lands at ``factors`` x the forecast (its
    metrics rows and tracking.json), and the verdict step's verdict.json."""
    (tmp_path / "exp/prediction").mkdir(parents=True)
    shutil.copy(V1, tmp_path / "exp/prediction" / PREDICTION_FILE)
    record = Prediction.from_json(read_sealed(str(tmp_path / "exp/prediction" / PREDICTION_FILE)))
    actual = [p.point * f for p, f in zip(record.points, factors, strict=True)]
    points = [
        {"step": p.step, "fraction": p.details["fraction"], "value": v}
        for p, v in zip(record.points, actual, strict=True)
    ]
    write_json_atomic(
        str(tmp_path / "exp/target-eval" / CURVE_FILE), {"metric": record.metric, "points": points}
    )
    target = tmp_path / "exp/target"
    target.mkdir()
    tracking = Tracking(
        str(tmp_path / "exp/prediction" / PREDICTION_FILE), str(record.sha256), record.metric_path
    )
    (target / "tracking.json").write_text(json.dumps(tracking.to_json()))
    rows = [
        {"step": p.step, "eval": {"micro": {"bpb": v}}} for p, v in zip(record.points, actual, strict=True)
    ]
    (target / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    score_prediction(
        VerdictConfig(
            str(tmp_path / "exp/verdict"), str(tmp_path / "exp/prediction"), str(tmp_path / "exp/target-eval")
        )
    )
    return tmp_path


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    return scored_ladder(tmp_path)


def test_every_surface_states_the_same_signed_error(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = Verdict.from_json(read_sealed(str(prefix / "exp/verdict/verdict.json")))
    end = verdict.endpoint
    expected = 100 * (end.band.point - end.actual) / end.actual
    assert end.error_pct == pytest.approx(expected) and expected == pytest.approx(100 * (1 / 1.02 - 1))
    assert not end.inside and expected < 0  # the run came in above the forecast: the forecast was too low
    text = f"{expected:+.2f}%"
    assert text == "-1.96%"

    assert f"error {text}" in verdict_body(verdict)  # the verdict's issue comment
    view = _view(prefix, ("exp/target", "exp/target", "SUCCESS"))
    status = "\n".join(tracking_section(view.steps))  # the status comment
    assert (
        f"off track by {text} (outside the 90% interval)" in status and f"| off track by {text} |" in status
    )

    page = for_step(str(prefix), str(prefix / "exp/target"))  # the dashboard's step page
    assert page is not None and page["summary"].startswith(f"off track by {text}")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(marin.dashboard.__file__).parent / "templates")
    )
    html = env.get_template("_prediction.html").render(
        prefix=str(prefix), step={"path": str(prefix / "exp/target")}, prediction_for=for_step
    )
    assert f"<td>off track by {text}</td>" in html

    api = TestClient(create_app(str(prefix))).get("/api/predictions").json()  # the calibration listing
    assert api["predictions"][0]["error_pct"] == pytest.approx(expected)
    assert predictions_main(["--prefix", str(prefix)]) == 0  # marin predictions
    assert re.search(rf"\s{re.escape(text)}\s+OUTSIDE", capsys.readouterr().out)

    band = eval_band(Prediction.from_json(read_sealed(str(prefix / "exp/prediction" / PREDICTION_FILE))), "p")
    facts = RunFacts(num_steps=100, update_window=16, skip_nonfinite=True, max_grad_norm=1.0)
    history = History(facts=facts, evals=[{"step": end.band.step, "eval": {"micro": {"bpb": end.actual}}}])
    finding = band.check(history)  # the target's health alert
    assert finding is not None and f"forecast error {text}" in finding.summary
    assert finding.values["error_pct"] == pytest.approx(expected)
