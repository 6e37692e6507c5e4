"""`marin compare` and the compare library on a real executor run of a baseline and a renamed ablation
(tests/compare/lab.py): names resolved, every number equal to the records, differences and standard
errors, curves on shared axes (step, tokens, FLOPs), smoothing and downsampling, the config difference
across step names, the baseline rule, headline metrics, and `marin plan`'s pairing of a renamed step."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from marin.compare import CompareError, PrefixSource, baseline_of, compare, headline, resolve
from marin.compare.cli import main as compare_main
from marin.compare.curves import curve_set, downsample, ema_smooth
from marin.graph import build_graph
from marin.graph.plan import make_plan
from marin.storage import storage_for
from tests.compare import lab


@pytest.fixture
def lab_run(run_marin: Any, marin_prefix: str) -> tuple[str, str, str]:
    base, ablation = lab.run_lab(run_marin)
    return marin_prefix, base, ablation


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = compare_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def row(doc: dict[str, Any], metric: str) -> dict[str, Any]:
    return next(r for r in doc["metrics"] if r["metric"] == metric)


def test_compare_json_matches_the_records(lab_run: tuple[str, str, str], capsys: Any) -> None:
    prefix, base, ablation = lab_run
    code, out, err = cli(capsys, "exp90", "exp91", "--prefix", prefix, "--format", "json", "--x", "tokens")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["label"] for r in doc["runs"]] == [base, ablation]
    assert [s["name"] for s in doc["runs"][1]["steps"]] == ["train/tiny-lr_half", "eval/tiny-lr_half"]
    macro = row(doc, "eval:macro.bpb")
    want = [(lab.bpb(lr, "python") + lab.bpb(lr, "prose")) / 2 for lr in (0.004, 0.002)]
    assert [v["value"] for v in macro["values"]] == pytest.approx(want, abs=1e-12)
    assert macro["diff"][1] == pytest.approx(want[1] - want[0], abs=1e-12)
    assert macro["diff_stderr"] == [None, None]  # eval.json gives no standard error
    acc = row(doc, "choices:stdlib_next_line_v1.acc")
    assert [v["stderr"] for v in acc["values"]] == [0.02, 0.02]
    assert acc["diff"][1] == pytest.approx(lab.accuracy(0.002)[0] - lab.accuracy(0.004)[0])
    assert acc["diff_stderr"][1] == pytest.approx(math.sqrt(2) * 0.02)
    loss = row(doc, "train:loss")
    assert [v["value"] for v in loss["values"]] == pytest.approx([lab.loss_at(200, 0.004),
                                                                   lab.loss_at(200, 0.002)])
    assert row(doc, "train:step")["values"][1]["value"] == lab.ROWS
    curve = doc["curves"][0]
    assert curve["axis"] == "tokens" and curve["metric"] == "loss"
    for series in curve["series"]:
        assert series["points"] == lab.ROWS  # the eval row is not a training row
        assert series["x"][0] == lab.BATCH * lab.SEQ and series["x"][-1] == lab.ROWS * lab.BATCH * lab.SEQ
    pairs = doc["config"][0]["pairs"]
    train_pair = next(p for p in pairs if p["other"]["name"] == "train/tiny-lr_half")
    assert train_pair["base"]["name"] == "train/tiny"
    assert [c["text"] for c in train_pair["changes"] if c["field"].startswith("config")] == [
        "config.lr: 0.004 -> 0.002"]
    eval_pair = next(p for p in pairs if p["other"]["name"] == "eval/tiny-lr_half")
    dep = next(c for c in eval_pair["changes"] if c["field"].startswith("dependency"))
    assert dep["field"] == "dependency train/tiny -> train/tiny-lr_half"
    assert [b["text"] for b in dep["because"]] == ["config.lr: 0.004 -> 0.002"]


def test_compare_text_shows_values_differences_and_the_config(lab_run: tuple[str, str, str],
                                                              capsys: Any) -> None:
    prefix, base, ablation = lab_run
    code, out, err = cli(capsys, base, "train/tiny-lr_half", "--prefix", prefix)
    assert code == 0, err
    first = lab.loss_at(200, 0.004)
    second = lab.loss_at(200, 0.002)
    line = next(line for line in out.splitlines() if line.strip().startswith("train:loss "))
    assert f"{first:.4g}" in line and f"{second:.4g} ({second - first:+.4g})" in line
    assert "config.lr: 0.004 -> 0.002" in out
    assert f"[0] {base}" in out and "[1] train/tiny-lr_half@" in out


def test_one_name_is_compared_with_its_baseline(lab_run: tuple[str, str, str]) -> None:
    prefix, base, ablation = lab_run
    source = PrefixSource(prefix)
    assert baseline_of(source, ablation) == base
    assert baseline_of(source, base) is None
    result = compare(source, [ablation])
    assert [r.label for r in result.runs] == [base, ablation]
    with pytest.raises(CompareError, match="has no baseline experiment"):
        compare(source, [base])


def test_names_resolve_by_id_name_hash_and_path(lab_run: tuple[str, str, str]) -> None:
    prefix, base, _ = lab_run
    source = PrefixSource(prefix)
    by_name = resolve(source, "train/tiny")
    assert by_name.kind == "step" and by_name.steps[0].name == "train/tiny"
    step = by_name.steps[0]
    assert resolve(source, step.hash[:10]).steps == (step,)
    assert resolve(source, f"{prefix}/{step.rel}").steps == (step,)
    assert resolve(source, step.rel).steps == (step,)
    assert [s.name for s in resolve(source, base).steps] == ["train/tiny", "eval/tiny"]
    with pytest.raises(CompareError, match="names 2 experiments"):
        resolve(source, "exp9")
    with pytest.raises(CompareError, match="is no experiment id, step output path, step name or step hash"):
        resolve(source, "train/nope")


def test_cli_errors_exit_2_with_the_fix(lab_run: tuple[str, str, str], capsys: Any, tmp_path: Any) -> None:
    prefix, _, _ = lab_run
    code, _, err = cli(capsys, "train/nope", "exp90", "--prefix", prefix)
    assert code == 2 and "'train/nope' is no experiment id" in err and "marin status --prefix" in err
    code, _, err = cli(capsys, "a", "b", "--prefix", str(tmp_path / "empty"))
    assert code == 2 and "no experiments under" in err and "--prefix" in err
    code, _, err = cli(capsys, "exp90", "exp91", "--prefix", prefix, "--smooth", "1.5")
    assert code == 2 and "smoothing 1.5 must be in [0, 1)" in err


def test_curves_share_axes_smooth_and_downsample(lab_run: tuple[str, str, str]) -> None:
    prefix, base, ablation = lab_run
    source = PrefixSource(prefix)
    runs = [resolve(source, base), resolve(source, ablation)]
    flops = curve_set(source, runs, "loss", "flops")
    assert flops.curves[0].xs[-1] == lab.ROWS * lab.BATCH * lab.SEQ * lab.FLOPS_PER_TOKEN
    small = curve_set(source, runs, "loss", "step", ema=0.9, max_points=41)
    assert small.downsampled and small.ema == 0.9
    for curve in small.curves:
        assert len(curve.xs) <= 41 and curve.xs[-1] == lab.ROWS
    raw = [lab.loss_at(s, 0.004) for s in range(1, lab.ROWS + 1)]
    smoothed = ema_smooth(raw, 0.9)
    assert smoothed[0] == pytest.approx(raw[0])  # debiased: the first point is the first value
    acc = 0.0
    for y in raw[:3]:
        acc = 0.9 * acc + 0.1 * y
    assert smoothed[2] == pytest.approx(acc / (1 - 0.9 ** 3))
    xs = list(range(1000))
    ys = [0.0] * 1000
    ys[517] = 9.0  # a spike survives downsampling
    dx, dy = downsample(xs, ys, 100)
    assert 9.0 in dy and dx[-1] == 999 and len(dx) <= 100
    missing = curve_set(source, runs, "no_such_metric")
    assert missing.curves == () and len(missing.missing) == 2


def test_headline_is_the_verdict_and_its_numbers(lab_run: tuple[str, str, str]) -> None:
    prefix, base, ablation = lab_run
    source = PrefixSource(prefix)
    h = headline(source, ablation)
    assert h.outcome in ("worked", "did_not_work")
    want = (lab.bpb(0.002, "python") + lab.bpb(0.002, "prose")) / 2
    assert h.metrics[0].name == "eval/tiny-lr_half:macro.bpb" and h.metrics[0].value == pytest.approx(want)
    assert "macro.bpb" in h.deciding
    plain = headline(source, base)
    assert plain.outcome is None
    names = [m.name for m in plain.metrics]
    assert names[0] == "eval/tiny:macro.bpb" and "eval/tiny:stdlib_next_line_v1.acc" in names
    acc = next(m for m in plain.metrics if m.name.endswith(".acc"))
    assert acc.stderr == 0.02


def test_plan_pairs_a_renamed_step_with_its_most_similar_predecessor(run_marin: Any,
                                                                      marin_prefix: str) -> None:
    run_marin([lab.evaluation], script="experiments/exp90_tiny.py")
    plan = make_plan(build_graph([lab.evaluation, lab.evaluation_half]), marin_prefix,
                     storage_for(marin_prefix))
    by_name = {e.name: e for e in plan.entries}
    train = by_name["train/tiny-lr_half"]
    assert train.action == "run"
    assert train.changed[0].startswith("compared with train/tiny: no earlier step named train/tiny-lr_half")
    assert "config.lr: 0.004 -> 0.002" in train.changed
    assert train.previous_hash == by_name["train/tiny"].hash
    ev = by_name["eval/tiny-lr_half"]
    assert "dependency train/tiny -> train/tiny-lr_half changed: config.lr: 0.004 -> 0.002" in ev.changed
    assert "config.lr: 0.004 -> 0.002" in plan.table()


def test_plan_pairs_an_eval_with_the_eval_of_its_trains_pair(lab_run: tuple[str, str, str],
                                                             marin_prefix: str) -> None:
    """lr 0.001 is one field away from both earlier trains (0.004, 0.002): the newest wins, and the eval is
    paired with that train's eval, not with any eval of the same config."""
    plan = make_plan(build_graph([lab.evaluation, lab.evaluation_quarter]), marin_prefix,
                     storage_for(marin_prefix))
    by_name = {e.name: e for e in plan.entries}
    train = by_name["train/tiny-lr_quarter"]
    assert train.changed[:2] == [
        "compared with train/tiny-lr_half: no earlier step named train/tiny-lr_quarter here; it is the most "
        "similar earlier step running the same function", "config.lr: 0.002 -> 0.001"]
    ev = by_name["eval/tiny-lr_quarter"]
    assert ev.changed[0].startswith("compared with eval/tiny-lr_half:")
    assert ev.changed[1:] == ["dependency train/tiny-lr_half -> train/tiny-lr_quarter changed: "
                              "config.lr: 0.002 -> 0.001"]


def test_plan_pairs_across_names_for_a_bounded_number_of_steps(run_marin: Any, marin_prefix: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `CROSS_NAME_BUDGET` searches a renamed step gets no `changed` lines (a 10,000-step DAG next to
    many others is not diffed against 32 candidates per step)."""
    import marin.graph.plan as plan_module

    run_marin([lab.evaluation], script="experiments/exp90_tiny.py")
    monkeypatch.setattr(plan_module, "CROSS_NAME_BUDGET", 1)
    plan = make_plan(build_graph([lab.evaluation, lab.evaluation_half]), marin_prefix,
                     storage_for(marin_prefix))
    by_name = {e.name: e for e in plan.entries}
    assert by_name["train/tiny-lr_half"].changed[0].startswith("compared with train/tiny:")
    assert by_name["eval/tiny-lr_half"].action == "run" and by_name["eval/tiny-lr_half"].changed == []
