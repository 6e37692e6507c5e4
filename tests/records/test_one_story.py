"""One ladder's records through every surface tell one story (issue 34, item 6): the ladder's verdict
(verdict.json and the verdict step's line), its issue comment, the status comment, the dashboard's step page,
``marin predictions``, the target's health alert and the experiment's verdict (exp15's criterion on
``verdict.json/endpoint_hit``) agree on whether the forecast was inside its 90% interval and by how much,
and each states the miss in the same plain words next to the signed number.

Built on tests/records/test_one_sign.py's ladder (the v1 record of tests/fakes/records_v1), once with the
run landing 2% above the forecast (outside: the loss came out higher than forecast) and once 0.1% below it
(inside)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jinja2
import pytest

import marin.dashboard
from marin.dashboard.predictions import for_step
from marin.status.verdicts import combine, judge_criterion, read_metric
from marin.storage.fs import storage_for
from marin.tracking.predictions import list_predictions, tracking_section, verdict_body
from marin.tracking.predictions_cli import main as predictions_main
from moe_trainer.health_rules import History, RunFacts, _error_words
from openlab_records import PREDICTION_FILE, Prediction, Verdict, error_words, read_sealed
from operators.scaling.band import eval_band
from tests.records.test_one_sign import scored_ladder
from tests.tracking.test_predictions import _view

CASES = {"higher": (1.0, 1.0, 1.0, 1.02), "lower-inside": (1.0, 1.0, 1.0, 0.999)}


class _Exp:
    """The one thing judge_criterion asks of an experiment: a number from a step's output."""

    def __init__(self, prefix: Path) -> None:
        self.storage, self.prefix = storage_for(str(prefix)), str(prefix)

    def number(self, h: str, path: str) -> tuple[float | None, str, bool]:
        return read_metric(self.storage, f"{self.prefix}/exp/verdict", path), "", False


def _experiment_outcome(prefix: Path) -> str:
    criterion: dict[str, Any] = {  # exp15's ENDPOINT_INSIDE, as the notebook freezes it
        "metric": "exp/verdict:verdict.json/endpoint_hit",
        "better": "higher",
        "hash": "h",
        "path": "verdict.json/endpoint_hit",
        "min_effect": 1.0,
        "baseline": {"kind": "value", "value": 0.0, "label": "fixed 0"},
    }
    return combine([judge_criterion(_Exp(prefix), criterion)], True)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("factors", list(CASES.values()), ids=list(CASES))
def test_every_surface_tells_one_story(
    tmp_path: Path, factors: tuple[float, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = scored_ladder(tmp_path, factors)
    verdict = Verdict.from_json(read_sealed(str(prefix / "exp/verdict/verdict.json")))
    end = verdict.endpoint
    inside, number = end.inside, f"{end.error_pct:+.2f}%"
    words = error_words(end.error_pct, verdict.metric)
    assert inside == (factors[-1] == 0.999)  # the two cases really differ
    way = "lower" if inside else "higher"
    assert (
        words == f"the run's micro.bpb came out {way} than forecast (the forecast was "
        f"{abs(end.error_pct):.2f}% too {'high' if inside else 'low'})"
    )
    state = "on track" if inside else f"off track by {number}"
    where = "inside" if inside else "outside"

    raw = read_sealed(str(prefix / "exp/verdict/verdict.json"))  # the ladder's verdict
    assert raw["endpoint"]["inside"] is inside and raw["endpoint_hit"] == int(inside)
    err = capsys.readouterr().err  # the verdict step's own line
    assert f"({number}), {'inside' if inside else 'OUTSIDE'}" in err and words in err

    comment = verdict_body(verdict)  # the verdict's issue comment
    assert f"error {number} ((predicted - actual) / actual; {where} the 90% interval): {words}." in comment

    status = "\n".join(tracking_section(_view(prefix, ("exp/target", "exp/target", "SUCCESS")).steps))
    assert f"): {state} ({where} the 90% interval)" in status and f"{number}: {words}" in status

    page = for_step(str(prefix), str(prefix / "exp/target"))  # the dashboard's step page
    assert page is not None and page["summary"].startswith(f"{state} ({where}") and words in page["summary"]
    html = (
        jinja2.Environment(
            loader=jinja2.FileSystemLoader(Path(marin.dashboard.__file__).parent / "templates")
        )
        .get_template("_prediction.html")
        .render(prefix=str(prefix), step={"path": str(prefix / "exp/target")}, prediction_for=for_step)
    )
    assert f"<td>{state}</td>" in html and words in html

    row = list_predictions(str(prefix))["predictions"][0]  # marin predictions (JSON and table)
    assert row["inside"] is inside and row["error_pct"] == pytest.approx(end.error_pct)
    assert row["error_words"] == words
    assert predictions_main(["--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert f" {number} {'inside' if inside else 'OUTSIDE'}" in out and words in out

    record = Prediction.from_json(read_sealed(str(prefix / "exp/prediction" / PREDICTION_FILE)))
    facts = RunFacts(num_steps=100, update_window=16, skip_nonfinite=True, max_grad_norm=1.0)
    history = History(facts=facts, evals=[{"step": end.band.step, "eval": {"micro": {"bpb": end.actual}}}])
    finding = eval_band(record, "p").check(history)  # the target's health alert
    assert (finding is None) is inside
    if finding is not None:
        assert f"forecast error {number}: {words})" in finding.summary

    assert _experiment_outcome(prefix) == ("worked" if inside else "did_not_work")  # the experiment's verdict


@pytest.mark.parametrize("error", [-11.83, -0.004, 0.0, 2.5, math.nan, math.inf])
def test_the_alert_words_the_error_as_the_records_do(error: float) -> None:
    assert _error_words(error, "micro.bpb") == error_words(error, "micro.bpb")
