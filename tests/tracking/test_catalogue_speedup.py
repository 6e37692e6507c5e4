"""Ideas ranked by compute-equivalent speedup (issue 34, item 5): experiments whose criterion reads a
``compute_multiplier`` (the speedup step's speedup.json) carry it in the catalogue, and ``marin catalogue
--sort speedup`` (and the dashboard's ``/api/catalogue?sort=speedup``) put them first, largest first."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient

from marin import Criterion, ExecutorMainConfig, Step, run_experiment, this_output_path
from marin.cli import main as marin_main
from marin.dashboard.app import create_app
from moe_trainer.jsonio import write_json_atomic
from operators.scaling.speedup import SPEEDUP_FILE, ComputeMultiplier


@dataclasses.dataclass(frozen=True)
class SpeedupOut:
    output_path: str
    point: float


def write_speedup(config: SpeedupOut) -> None:
    """What the speedup step writes, for a multiplier given outright (the step: test_scaling_speedup)."""
    m = ComputeMultiplier(config.point, config.point * 0.9, config.point * 1.1, 0.9, ())
    write_json_atomic(f"{config.output_path}/{SPEEDUP_FILE}", m.to_json())


def _idea(prefix: str, script: str, multiplier: float) -> str:
    step = Step(name="abl/speedup", fn=write_speedup, config=SpeedupOut(this_output_path(), multiplier))
    worth = Criterion("abl/speedup:speedup.json/compute_multiplier", "higher", 1.0)
    result = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script=f"experiments/{script}.py", hypothesis=f"{script} is worth more compute",
                            criterion=worth)
    return result.experiment_id


def test_catalogue_sorts_ideas_by_compute_multiplier(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    prefix = str(tmp_path)
    ids = {m: _idea(prefix, f"exp{i}_idea", m) for i, m in enumerate((1.05, 1.21, 0.92))}
    capsys.readouterr()
    assert marin_main(["catalogue", "--prefix", prefix, "--format", "json", "--sort", "speedup"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["experiment"] for r in doc["experiments"]] == [ids[1.21], ids[1.05], ids[0.92]]
    assert [r["compute_multiplier"] for r in doc["experiments"]] == pytest.approx([1.21, 1.05, 0.92])
    assert [r["outcome"] for r in doc["experiments"]] == ["worked", "worked", "did_not_work"]
    assert marin_main(["catalogue", "--prefix", prefix, "--sort", "speedup"]) == 0
    table = capsys.readouterr().out
    first, second = table.index("worth 1.21× compute"), table.index("worth 1.05× compute")
    assert first < second < table.index("worth 0.92× compute")
    api = TestClient(create_app(prefix)).get("/api/catalogue", params={"sort": "speedup"}).json()
    assert [r["experiment"] for r in api["experiments"]] == [ids[1.21], ids[1.05], ids[0.92]]
