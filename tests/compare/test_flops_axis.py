"""The FLOPs axis for a run recorded before FLOPs were logged (marin/compare/flops.py): its train_result.json
has no `flops_per_token`, so the count is derived from its train_config.json by the step's config class
(operators/train.py), with the trainer's own function, and the chart, the JSON and the text say so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import draccus
import pytest

from marin.compare import PrefixSource
from marin.compare.charts import line_chart
from marin.compare.comparison import compare
from marin.compare.curves import curve_set
from marin.compare.runs import Run, StepRef
from marin.compare.text import comparison_text
from moe_trainer.metrics import train_flops_per_token
from operators.train import TrainConfig, trainer_config

ROWS, BATCH, SEQ = 10, 4, 32
HASH = "0123abcd" * 8
REL = "train/old-0123abcd"
NEW_HASH, NEW_REL = "89abcdef" * 8, "train/new-89abcdef"


def _write(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _old_run(prefix: Path, config_class: str = "operators.train:TrainConfig") -> float:
    """A train step's records as the trainer wrote them before train_result.json carried flops_per_token
    (train_config.json: the real trainer config of the tiny preset); returns what the trainer logs today."""
    out = prefix / REL
    tc = trainer_config(TrainConfig(output_path=str(out), train_cache=str(prefix / "cache"), preset="tiny",
                                    batch_size=BATCH, seq_len=SEQ))
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 5.0 - 0.1 * s, "lr": 0.001}) + "\n" for s in range(1, ROWS + 1)))
    _write(out / "train_config.json", draccus.encode(tc))
    _write(out / "train_result.json", {"step": ROWS, "loss": 4.0, "tokens_per_s": 100.0})
    _write(out / ".marin" / "step.json", {"name": "train/old", "hash": HASH, "output_path": str(out),
                                          "config_class": config_class})
    _write(prefix / "experiments" / "old-0123abcd.json", {
        "id": "old-0123abcd", "created": 1.0, "runs": [],
        "steps": [{"name": "train/old", "hash": HASH, "output_path": str(out), "dependencies": []},
                  {"name": "train/new", "hash": NEW_HASH, "output_path": str(prefix / NEW_REL),
                   "dependencies": []}]})
    return train_flops_per_token(tc.model, tc.data.seq_len)


RUN = Run(label="old", kind="step", steps=(StepRef("train/old", HASH, REL),))


def test_flops_of_a_run_recorded_before_they_were_logged_are_derived_from_its_config(tmp_path: Path) -> None:
    expected = _old_run(tmp_path)
    assert expected > 0
    cs = curve_set(PrefixSource(str(tmp_path)), [RUN], "loss", "flops")
    assert cs.missing == () and cs.derived == ("old",)
    assert cs.curves[0].xs[-1] == ROWS * BATCH * SEQ * expected
    assert cs.curves[0].xs[0] == 1 * BATCH * SEQ * expected
    notes = line_chart(cs).notes
    assert any(n.startswith("FLOPs of old derived from the run's train_config.json") for n in notes), notes

    # beside a run that logged its FLOPs: only the old one is marked, in the JSON and the text
    new = tmp_path / NEW_REL
    new.mkdir(parents=True)
    for name in ("metrics.jsonl", "train_config.json"):
        (new / name).write_bytes((tmp_path / REL / name).read_bytes())
    _write(new / "train_result.json", {"step": ROWS, "loss": 4.0, "flops_per_token": expected})
    both = compare(PrefixSource(str(tmp_path)), [REL, NEW_REL], axis="flops")
    curves = both.to_json()["curves"][0]
    assert curves["flops_derived"] == ["train/old@0123abcd"]
    assert [s["x"][-1] for s in curves["series"]] == [ROWS * BATCH * SEQ * expected] * 2
    assert "(FLOPs of train/old@0123abcd derived from its train_config.json" in comparison_text(both)


def test_logged_flops_win_and_are_not_marked_derived(tmp_path: Path) -> None:
    _old_run(tmp_path)
    _write(tmp_path / REL / "train_result.json", {"step": ROWS, "loss": 4.0, "flops_per_token": 1234.0})
    cs = curve_set(PrefixSource(str(tmp_path)), [RUN], "loss", "flops")
    assert cs.derived == () and cs.curves[0].xs[-1] == ROWS * BATCH * SEQ * 1234.0
    assert not any("derived" in n for n in line_chart(cs).notes)


@pytest.mark.parametrize(("config_class", "reason"), [
    ("tests.compare.test_flops_axis:Plain",
     "tests.compare.test_flops_axis:Plain defines no flops_per_token_from_config to derive it from "
     "train_config.json"),
    ("no_such_module_xyz:Config", "no_such_module_xyz:Config cannot be imported to derive it "
                                  "(ModuleNotFoundError: No module named 'no_such_module_xyz')"),
], ids=["no-derivation", "not-importable"])
def test_a_run_whose_flops_cannot_be_derived_has_no_curve_and_the_reason(tmp_path: Path, config_class: str,
                                                                         reason: str) -> None:
    _old_run(tmp_path, config_class)
    cs = curve_set(PrefixSource(str(tmp_path)), [RUN], "loss", "flops")
    assert cs.curves == () and cs.derived == ()
    assert cs.missing == (f"old: no flops_per_token in train_result.json, and {reason}",)


def test_a_config_the_class_cannot_read_is_named_with_its_error(tmp_path: Path) -> None:
    _old_run(tmp_path)
    cfg = json.loads((tmp_path / REL / "train_config.json").read_text())
    cfg["model"]["n_layerz"] = 2  # a field this trainer does not know
    _write(tmp_path / REL / "train_config.json", cfg)
    cs = curve_set(PrefixSource(str(tmp_path)), [RUN], "loss", "flops")
    assert cs.curves == ()
    assert cs.missing[0].startswith("old: no flops_per_token in train_result.json, and operators.train:"
                                    "TrainConfig.flops_per_token_from_config failed on train_config.json (")
    assert "n_layerz" in cs.missing[0]


class Plain:
    """A config class that offers no derivation."""
