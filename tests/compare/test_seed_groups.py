"""Seed groups in `marin compare` (marin/compare/seeds.py): six real runs of the executor (local backend), a
baseline and a half-learning-rate ablation, each with seeds 0, 1 and 2 as experiments of their own. The runs
whose configs differ only in `seed` form two groups; the table by group shows each metric's mean ± standard
error across seeds and the difference of the groups with its standard error, every number computed here
again from the records the steps wrote (the trainer's and evaluators' formats, tests/compare/lab.py)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from marin import Step, output_path_of
from marin.compare import PrefixSource, compare
from marin.compare.cli import main as compare_main
from marin.compare.render import render_compare
from marin.compare.seeds import is_seed_field
from tests.compare.lab import FakeEvalConfig, FakeTrainConfig, fake_eval, loss_at

SEEDS = (0, 1, 2)


def seeded_train(config: FakeTrainConfig) -> None:
    """The lab's fake trainer with a seed that moves the loss (as an initialisation does), in its formats."""
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    wobble = 0.03 * ((config.seed * 7) % 5 - 2)  # seeds 0, 1, 2: -0.06, 0, +0.06
    rows = [{"step": s, "loss": loss_at(s, config.lr) + wobble, "lr": config.lr, "tokens_per_s": 1000.0,
             "time": float(s)} for s in range(1, 51)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "train_result.json").write_text(json.dumps({"step": 50, "loss": rows[-1]["loss"]}))


def seeded_eval(config: FakeEvalConfig) -> None:
    """The lab's evaluator, its bits per byte moved by the trained loss (so by the seed)."""
    fake_eval(config)
    loss = json.loads(Path(config.checkpoint, "train_result.json").read_text())["loss"]
    path = Path(config.output_path, "eval.json")
    doc = json.loads(path.read_text())
    for d in doc["domains"].values():
        d["bpb"] = round(d["bpb"] + loss / 10, 6)
    doc["macro"]["bpb"] = sum(d["bpb"] for d in doc["domains"].values()) / 2
    path.write_text(json.dumps(doc))


def _steps(lr: float, seed: int, tag: str) -> Step:
    train = Step(name=f"train/{tag}-s{seed}", fn=seeded_train, config=FakeTrainConfig(lr=lr, seed=seed))
    return Step(name=f"eval/{tag}-s{seed}", fn=seeded_eval,
                config=FakeEvalConfig(checkpoint=output_path_of(train)))


@pytest.fixture
def seeded(run_marin: Any, marin_prefix: str) -> tuple[str, list[str]]:
    ids = []
    for n, (lr, tag) in enumerate(((0.004, "base"), (0.002, "half"))):
        for seed in SEEDS:
            result = run_marin([_steps(lr, seed, tag)], script=f"experiments/exp9{n}_{tag}_seed{seed}.py")
            assert result.status == "SUCCESS"
            ids.append(result.experiment_id)
    return marin_prefix, ids


def _record(prefix: str, name: str, file: str) -> dict[str, Any]:
    [path] = Path(prefix).glob(f"{name}-*/{file}")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def test_runs_that_differ_only_in_seed_are_grouped_with_mean_and_standard_error(
        seeded: tuple[str, list[str]]) -> None:
    prefix, ids = seeded
    c = compare(PrefixSource(prefix), ids)
    assert [(g.members, g.seeds) for g in c.groups] == [
        ((0, 1, 2), ("seed=0", "seed=1", "seed=2")), ((3, 4, 5), ("seed=0", "seed=1", "seed=2"))]
    by_key = {r.key: r for r in c.group_rows}
    for key, (file, path) in {"eval:macro.bpb": ("eval/{}-s{}", "eval.json"),
                              "train:loss": ("train/{}-s{}", "train_result.json")}.items():
        groups = []
        for tag in ("base", "half"):
            doc_key = ("macro", "bpb") if path == "eval.json" else ("loss",)
            xs = []
            for s in SEEDS:
                doc = _record(prefix, file.format(tag, s), path)
                xs.append(doc[doc_key[0]][doc_key[1]] if len(doc_key) == 2 else doc[doc_key[0]])
            groups.append(_mean_se(xs))
        row = by_key[key]
        assert [(v.mean, v.stderr, v.n) for v in row.values if v] == [
            pytest.approx((m, se, 3)) for m, se in groups]
        assert row.diffs[1] == pytest.approx(groups[1][0] - groups[0][0])
        assert row.diff_stderrs[1] == pytest.approx(math.hypot(groups[0][1], groups[1][1]))
        assert groups[0][1] > 0  # the seeds really differ: a standard error of 0 would prove nothing
    # the multiple-choice accuracy does not depend on the seed: its standard error across seeds is 0
    acc = by_key["choices:stdlib_next_line_v1.acc"]
    assert acc.values[0] is not None and acc.values[0].stderr == 0.0

    doc = c.to_json()
    assert doc["seed_groups"] == [{"runs": [0, 1, 2], "seeds": ["seed=0", "seed=1", "seed=2"]},
                                  {"runs": [3, 4, 5], "seeds": ["seed=0", "seed=1", "seed=2"]}]
    [bpb] = [r for r in doc["group_metrics"] if r["metric"] == "eval:macro.bpb"]
    assert bpb["values"][1]["n"] == 3 and bpb["diff"][1] == pytest.approx(by_key["eval:macro.bpb"].diffs[1])


def test_the_terminal_table_and_the_dashboard_table_show_the_groups(
        seeded: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    prefix, ids = seeded
    assert compare_main([*ids, "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    c = compare(PrefixSource(prefix), ids)
    row = next(r for r in c.group_rows if r.key == "eval:macro.bpb")
    base, half = row.values
    assert base is not None and half is not None and row.diffs[1] is not None
    assert "by seed group (mean ± standard error across seeds; differences are group - group 1):" in out
    assert "group 1: [0] seed=0, [1] seed=1, [2] seed=2" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("eval:macro.bpb") and "(n=" not in x
                and f"{base.mean:.4g} ± {base.stderr:.2g}" in x)
    assert f"{half.mean:.4g} ± {half.stderr:.2g} ({row.diffs[1]:+.4g} ± {row.diff_stderrs[1]:.2g})" in line

    html = str(render_compare(c))
    assert 'id="compare-seed-groups"' in html and 'data-metric="eval:macro.bpb"' in html
    assert f'data-mean="{base.mean}"' in html and f'data-diff="{row.diffs[1]}"' in html


def test_runs_that_differ_in_more_than_seeds_stay_apart(run_marin: Any, marin_prefix: str) -> None:
    """A seed and the learning rate changed together: two groups of one, and no table by group."""
    a = run_marin([_steps(0.004, 0, "a")], script="experiments/exp95_a.py").experiment_id
    b = run_marin([_steps(0.002, 1, "b")], script="experiments/exp96_b.py").experiment_id
    c = compare(PrefixSource(marin_prefix), [a, b])
    assert [g.members for g in c.groups] == [(0,), (1,)] and not c.has_seed_groups
    assert c.to_json()["group_metrics"] == []
    assert all(is_seed_field(f) for f in ("config.seed", "config.data_seed", "config.overrides.init_seed"))
    assert not any(is_seed_field(f) for f in ("config.seeds", "config.lr", "config.seed_text.x"))
