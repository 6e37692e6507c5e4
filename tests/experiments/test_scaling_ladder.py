"""The reduced exp15 ladder end to end (MARIN_LADDER_SMALL=1: 3 rungs x 2 seeds of 2k-8k parameters on the
delphi-v2 recipe, three targets) through the real CLI on the local tracker: the DAG puts each prediction
before its target, each record is posted (its own comment, with its hash) before its target's first step,
the status comment tracks the target against the band, the verdicts land on the issue and the dashboard,
every surface agrees on each endpoint, a second run recomputes nothing, and an edited record is caught by
its hash."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "experiments/exp15_scaling_ladder.py"


def marin(command: str, prefix: str, *flags: str, cache: str) -> subprocess.CompletedProcess[str]:
    # The ladder runs in the environment of its documented command (`MARIN_LADDER_SMALL=1 python
    # experiments/exp15_scaling_ladder.py`): exp15 sets its own XLA flags (LLVM -O0, no expensive passes),
    # and JAX sees the one CPU device a user's run has, not the eight fake devices that conftest.py gives the
    # sharding tests (which made each rung an 8-way partitioned program on 2 cores, compiled and run 8-way).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MARIN_") and k not in ("GITHUB_TOKEN", "XLA_FLAGS")}
    env.update(
        {
            "MARIN_LADDER_SMALL": "1",
            "MARIN_ISSUE_REPO": "local/experiments",
            "MARIN_TRACKER": "local",
            "MARIN_TRACKER_MIN_INTERVAL": "0.2",
            "JAX_COMPILATION_CACHE_DIR": cache,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lib/moe_trainer/src")]),
        }
    )
    cmd = [sys.executable, "-m", "marin", command, SCRIPT, "--prefix", prefix, "--backend", "local", *flags]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


@dataclasses.dataclass
class LadderRun:
    prefix: str
    cache: str
    paths: dict[str, str]


def read(path: str) -> Any:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> LadderRun:
    prefix = str(tmp_path_factory.mktemp("prefix"))
    cache = str(tmp_path_factory.mktemp("jax-cache"))
    first = marin("run", prefix, cache=cache)
    assert first.returncode == 0, f"stdout:\n{first.stdout[-3000:]}\nstderr:\n{first.stderr[-6000:]}"
    plan = marin("plan", prefix, "--format", "json", cache=cache)
    assert plan.returncode == 0, plan.stderr
    paths = {e["name"]: e["output_path"] for e in json.loads(plan.stdout)["steps"]}
    return LadderRun(prefix, cache, paths)


def test_the_target_depends_on_the_prediction_and_starts_after_it_was_posted(ladder: LadderRun) -> None:
    p = ladder.paths
    step = read(f"{p['exp15/target/train']}/.marin/step.json")
    assert "exp15/prediction" in [d["name"] for d in step["dependencies"]]
    record = read(f"{p['exp15/prediction']}/prediction.json")
    posted = read(f"{p['exp15/prediction']}/posted.json")
    assert posted["record_sha256"] == record["record_sha256"] and posted["issue"] == "local/experiments#15"
    target_started = read(f"{p['exp15/target/train']}/.marin/status.json")["started"]
    prediction_ended = read(f"{p['exp15/prediction']}/.marin/status.json")["ended"]
    first_row = json.loads(Path(f"{p['exp15/target/train']}/metrics.jsonl").read_text().splitlines()[0])
    assert prediction_ended <= posted["comment_created"] <= first_row["time"]
    assert prediction_ended <= target_started
    tracking = read(f"{p['exp15/target/train']}/tracking.json")
    assert tracking["record_sha256"] == record["record_sha256"]


def test_prediction_and_verdict_are_on_the_issue(ladder: LadderRun) -> None:
    from marin.tracking.local import LocalTracker

    p = ladder.paths
    sha = read(f"{p['exp15/prediction']}/prediction.json")["record_sha256"]
    verdict = read(f"{p['exp15/verdict']}/verdict.json")
    assert verdict["prediction_sha256"] == sha and verdict["n"] == 4
    comments = LocalTracker(ladder.prefix, "local/experiments").list_comments(15)
    prediction = [c for c in comments if c.body.startswith(f"<!-- marin-prediction:{sha} -->")]
    assert (
        len(prediction) == 1 and prediction[0].updated == prediction[0].created and sha in prediction[0].body
    )
    verdicts = [c for c in comments if c.body.startswith("<!-- marin-verdict:")]
    assert len(verdicts) == 3 and len([c for c in verdicts if sha in c.body]) == 1  # one per target
    # exp15's fixed E is stated on the comment and in the record's assumptions
    record = read(f"{p['exp15/prediction']}/prediction.json")
    assert "E fixed at 1.176 (an assumption, not fitted)" in prediction[0].body
    assert any(a.startswith("the irreducible loss is E = 1.176") for a in record["assumptions"])
    status = [c for c in comments if c.body.startswith("<!-- marin-status:")]
    assert len(status) == 1 and f"Prediction `{sha[:12]}`" in status[0].body
    assert "on track" in status[0].body or "off track by" in status[0].body


def test_the_targets_learning_rate_check_runs_after_the_forecast_and_is_posted(ladder: LadderRun) -> None:
    p = ladder.paths
    posted = read(f"{p['exp15/prediction']}/posted.json")
    fitted = {r["step_hash"] for r in read(f"{p['exp15/prediction']}/prediction.json")["inputs"]}
    rule_step = read(f"{p['exp15/target/train']}/.marin/step.json")
    rule_lr = rule_step["config"]["train"]["overrides"]["optimizer.lr"]
    ends = {"1": read(f"{p['exp15/target/eval']}/curve.json")["points"][-1]["value"]}
    for m in (0.5, 2.0):
        train = p[f"exp15/target/train-lrx{m:g}"]
        step = read(f"{train}/.marin/step.json")
        assert "exp15/prediction" in [d["name"] for d in step["dependencies"]]
        first_row = json.loads(Path(f"{train}/metrics.jsonl").read_text().splitlines()[0])
        assert posted["comment_created"] <= first_row["time"]  # trained only once the forecast was posted
        assert step["config"]["train"]["overrides"]["optimizer.lr"] == pytest.approx(m * rule_lr)
        assert step["config"]["train"]["seed"] == rule_step["config"]["train"]["seed"]
        assert step["hash"] not in fitted  # the forecast never saw these runs
        assert not Path(f"{train}/tracking.json").exists()  # not scored against the band
        ends[f"{m:g}"] = read(f"{p[f'exp15/target/eval-lrx{m:g}']}/curve.json")["points"][-1]["value"]
    note = read(f"{p['exp15/target/lr-check']}/note.json")
    assert note["prediction_sha256"] == posted["record_sha256"] and note["values"] == ends
    best = min(ends, key=lambda k: ends[k])
    assert note["best_multiple"] == float(best)
    assert note["rule_gap"] == pytest.approx(ends["1"] / ends[best] - 1)
    marker = f"<!-- marin-note:{note['record_sha256']} -->"
    notes = [c for c in _comments(ladder) if c.body.startswith(marker)]
    assert len(notes) == 1 and note["text"] in notes[0].body and posted["record_sha256"] in notes[0].body


def test_dashboard_shows_the_band_and_the_verdict(ladder: LadderRun) -> None:
    from fastapi.testclient import TestClient

    from marin.dashboard.app import create_app

    client = TestClient(create_app(ladder.prefix))
    rel = os.path.relpath(ladder.paths["exp15/target/train"], ladder.prefix)
    page = client.get(f"/steps/{rel}")
    assert page.status_code == 200 and 'id="prediction"' in page.text and "band-chart" in page.text
    assert ("on track" in page.text) or ("off track" in page.text)
    note_page = client.get(f"/steps/{os.path.relpath(ladder.paths['exp15/target/lr-check'], ladder.prefix)}")
    assert note_page.status_code == 200 and 'id="prediction-note"' in note_page.text
    assert "Learning rate at the target:" in note_page.text and "learning rate ended at" in note_page.text
    listing = client.get("/api/predictions").json()
    assert listing["scored"] == 3 and all(r["verdict_verified"] is True for r in listing["predictions"])


def test_each_target_is_frozen_before_its_run_and_every_surface_agrees(ladder: LadderRun) -> None:
    from marin.tracking.predictions import list_predictions

    p = ladder.paths
    extra = sorted({n.split("/")[1] for n in p if n.startswith("exp15/target-")})
    assert len(extra) == 2, sorted(p)
    names = [("exp15/prediction", "exp15/target/train", "exp15/verdict")] + [
        (f"exp15/{t}/prediction", f"exp15/{t}/train", f"exp15/{t}/verdict") for t in extra
    ]
    rows = {r["sha256"]: r for r in list_predictions(ladder.prefix)["predictions"]}
    shares = []
    for prediction, train, verdict_step in names:
        record = read(f"{p[prediction]}/prediction.json")
        posted = read(f"{p[prediction]}/posted.json")
        first_row = json.loads(Path(f"{p[train]}/metrics.jsonl").read_text().splitlines()[0])
        assert posted["record_sha256"] == record["record_sha256"]
        assert posted["comment_created"] <= first_row["time"]
        assert record["ladder"]["recipe"] == "delphi-v2" and len(record["ladder"]["targets"]) == 3
        # the record names the reference its rates came from: Marin's x128, re-tuned on the rungs
        assert record["ladder"]["v2_reference"]["multiple_of_marin"] == 128.0
        step = read(f"{p[train]}/.marin/step.json")["config"]["train"]["overrides"]
        assert step["optimizer.name"] == "adamh" and "optimizer.hyperball_lr" in step
        shares.append(record["ladder"]["compute_share"])
        verdict = read(f"{p[verdict_step]}/verdict.json")
        assert verdict["prediction_sha256"] == record["record_sha256"]
        row = rows[record["record_sha256"]]
        assert row["inside"] == verdict["endpoint"]["inside"] == bool(verdict["endpoint_hit"])
        assert row["error_pct"] == verdict["endpoint"]["error_pct"]
    assert shares == sorted(shares, reverse=True)
    outcome = _experiment_outcome(ladder)
    hits = [read(f"{p[v]}/verdict.json")["endpoint_hit"] for _, _, v in names]
    assert outcome == ("worked" if all(hits) else "did_not_work" if not any(hits) else "mixed")


def _experiment_outcome(ladder: LadderRun) -> str:
    found = list(Path(ladder.prefix, "experiments").glob("*/verdicts.json"))
    assert len(found) == 1
    return str(read(str(found[0]))["current"]["outcome"])


def test_a_second_run_recomputes_nothing(ladder: LadderRun) -> None:
    prediction = Path(ladder.paths["exp15/prediction"]) / "prediction.json"
    before = prediction.stat().st_mtime_ns
    plan = marin("plan", ladder.prefix, "--format", "json", cache=ladder.cache)
    assert {e["action"] for e in json.loads(plan.stdout)["steps"]} == {"skip"}
    comments = len(_comments(ladder))
    again = marin("run", ladder.prefix, cache=ladder.cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "RUNNING  " not in again.stderr
    assert prediction.stat().st_mtime_ns == before
    assert len(_comments(ladder)) == comments  # nothing posted twice


def _comments(ladder: LadderRun) -> list[Any]:
    from marin.tracking.local import LocalTracker

    return LocalTracker(ladder.prefix, "local/experiments").list_comments(15)


def test_an_edited_prediction_is_detected(ladder: LadderRun, tmp_path: Path) -> None:
    from marin.tracking.predictions import list_predictions
    from openlab_records import RecordTamperedError
    from operators.scaling.verdict import VerdictConfig, score_prediction

    copy = tmp_path / "prefix" / "prediction"
    shutil.copytree(ladder.paths["exp15/prediction"], copy)
    record = read(str(copy / "prediction.json"))
    record["points"][-1]["point"] = read(f"{ladder.paths['exp15/verdict']}/verdict.json")["points"][-1][
        "actual"
    ]
    (copy / "prediction.json").write_text(json.dumps(record))
    with pytest.raises(RecordTamperedError, match="edited after it was written"):
        score_prediction(
            VerdictConfig(
                output_path=str(tmp_path / "v"),
                prediction=str(copy),
                target_curve=ladder.paths["exp15/target/eval"],
            )
        )
    assert list_predictions(str(tmp_path / "prefix"))["predictions"][0]["verified"] is False
