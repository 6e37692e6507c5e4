"""The ``prediction``, target-train and ``verdict`` steps: a forecast frozen before the run, scored after.

**prediction** (``predict_target``) reads ``fit.json`` and writes ``prediction.json``, a sealed record
(:mod:`.records`): the metric, the target's evaluation points (step, tokens, 6·N·D and trainer FLOPs), the
point estimate and 90% interval at each (for one run, the target being one run; the interval of the mean
over seeds is kept too), the alternative forecast on the trainer-FLOPs axis, the leave-one-rung-out
predictions, the functional form, fitter and settings, every rung's step hash, curve hash and values, the
target step's config hash, the issue, the assumptions, and ``record_sha256``.

**The endpoint rule** (``end_rule``). ``"law"`` (the default): the end is forecast like every other point,
by the law fitted through the rungs' values there. ``"pre_decay_anchor"``: the law through the rungs' last
point before the end (75%: before the WSD decay, which starts at 80%) gives the target's value there, and
the end is that value minus the rungs' mean fall from that point to the end (each rung weighs the same; a
rung's fall is the mean over its seeds). Its interval adds, in quadrature, the anchor's interval and the
spread of one run's fall (the standard deviation of every rung run's fall, pooled over rungs, times the
normal quantile of the level, times sqrt(1 + 1/runs); for the mean over seeds, divided by sqrt(runs)). The
law's own end forecast (with its ``late_drop`` gate) is kept in the point's ``end_law``, so the verdict can
score both; the end point's ``params``, ``sigma_log`` and fit ``gates`` stay the end law's, and its
``late_drop`` gate, recomputed on the registered point, cannot flag (its fall is the rungs' mean). Why:
in the third to eighth real ladders the registered 75% points landed within 0.9% of every
10-tokens-per-parameter target, while the end law implied a fall past the decay larger than any rung's
and ended 1.9-9.2% low (docs/benchmarks/scaling-ladder.md).

**target train** (``train_target``) runs the target with the train operator, but first: it reads the
prediction record (refusing one whose hash does not match its content), checks that the record names this
target's config hash (config drift since the forecast is refused), and, when ``require_posted``, waits
until the engine has posted the record to the issue (``posted.json`` next to the record, naming its hash;
the engine writes it after creating the comment). It then writes ``tracking.json`` (the schema the engine
reads to show "on track / off track" while the run's evaluations land in metrics.jsonl) and trains, its
watcher given the record's band as the ``eval_band`` health rule (:mod:`.band`).
The DAG makes the target depend on the prediction step, so it cannot start before the record exists.

**verdict** (``score_prediction``) compares the target's curve (the same eval step as every rung) with the
record: at each point the signed error ``(predicted - actual) / actual`` in % (Marin's convention: negative
means the forecast was too low) and whether the actual is inside the interval; written as the sealed
``verdict.json`` quoting the prediction's hash.

**after the forecast** (``train_after_forecast``): a run that must start only once the record is frozen and
posted, without being scored against it (the target at other learning rates: :mod:`.lrcheck`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

from operators.scaling.band import with_eval_band
from operators.scaling.bootstrap import PERCENTILE
from operators.scaling.curve import CURVE_FILE
from operators.scaling.fit import ScalingFit
from operators.scaling.fitstep import FIT_FILE, read_bytes
from operators.scaling.inputs import LadderInputError
from operators.scaling.records import HASH_KEY, read_json, read_record, write_record
from operators.train import TrainConfig, runtime_field, train

PREDICTION_FILE, POSTED_FILE, TRACKING_FILE, VERDICT_FILE = (
    "prediction.json",
    "posted.json",
    "tracking.json",
    "verdict.json",
)
PREDICTION_SCHEMA, VERDICT_SCHEMA, TRACKING_SCHEMA = (
    "marin-prediction/v1",
    "marin-verdict/v1",
    "marin-tracking/v1",
)


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """What the forecast is about: the target run's size, length and evaluation steps."""

    name: str
    config_hash: str
    """The identity hash of the target's training config (without the dependency on the forecast)."""
    n_params: int
    tokens_per_step: int
    num_steps: int
    flops_per_token: float
    eval_steps: tuple[int, ...]
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class PredictionConfig:
    output_path: str
    """Where prediction.json is written."""
    fit: str
    """The fit step's output path."""
    target: TargetSpec
    """The target run."""
    experiment: str
    """The experiment the forecast belongs to (its script stem)."""
    issue: str | None = None
    """The issue the forecast is posted to (owner/repo#N)."""
    assumptions: tuple[str, ...] = ()
    """Stated assumptions (as Marin's #6044 did): what would make the forecast wrong."""
    loo_spread_limit: float = 0.05
    """Warn when the leave-one-rung-out predictions at the endpoint span more than this fraction of the
    point (the fourth real ladder: 20%, missed by 9%; the third: 4%, within 2%)."""
    end_rule: str = "law"
    """How the endpoint is forecast: ``"law"`` or ``"pre_decay_anchor"`` (the module docstring)."""

    def __post_init__(self) -> None:
        if self.end_rule not in END_RULES:
            raise ValueError(
                f"PredictionConfig: end_rule={self.end_rule!r} is not one of {', '.join(END_RULES)}: "
                "'law' fits the end like every point, 'pre_decay_anchor' takes the law at the point before "
                "the end minus the rungs' mean fall from there"
            )


END_RULES = ("law", "pre_decay_anchor")


def _point(fit: ScalingFit, compute: float) -> dict[str, float]:
    point, low, high = fit.predict(compute, single_run=True)
    _, low_mean, high_mean = fit.predict(compute)
    return {"point": point, "low": low, "high": high, "low_mean": low_mean, "high_mean": high_mean}


def rung_falls(runs: list[dict[str, Any]], start: float, end: float) -> dict[str, list[float]]:
    """Each rung's falls (one per seed, the rule's runs only) between fractions ``start`` and ``end``; runs
    without a value at either fraction are left out."""
    keys = (f"{start:g}", f"{end:g}")
    falls: dict[str, list[float]] = {}
    for r in runs:
        if r["lr_multiple"] == 1.0 and all(k in r["values"] for k in keys):
            falls.setdefault(r["rung"], []).append(r["values"][keys[0]] - r["values"][keys[1]])
    return falls


def anchored_end(points: list[dict[str, Any]], runs: list[dict[str, Any]], level: float) -> dict[str, Any]:
    """The ``pre_decay_anchor`` endpoint (module docstring): the point before the end minus the rungs' mean
    fall from there to the end, with its interval; the leave-one-rung-out forecasts recomputed the same way
    (each drops the rung from the anchor's law and from the mean fall)."""
    if len(points) < 2:
        raise ValueError("prediction: the pre_decay_anchor rule needs an evaluation point before the end")
    anchor, end = points[-2], points[-1]
    falls = rung_falls(runs, anchor["fraction"], end["fraction"])
    every = [f for v in falls.values() for f in v]
    if len(falls) < 2 or len(every) < 3:
        keys = (f"{anchor['fraction']:g}", f"{end['fraction']:g}")
        lacking = sorted(
            {
                f"{r['rung']} seed {r.get('seed', '?')}"
                for r in runs
                if r["lr_multiple"] == 1.0 and not all(k in r["values"] for k in keys)
            }
        )
        raise LadderInputError(
            f"prediction: the pre_decay_anchor rule needs the falls from {anchor['label']} to the end of at "
            f"least two rungs and three runs; {len(every)} run(s) have both points (rungs {sorted(falls)}), "
            f"these lack one: {', '.join(lacking) or 'none'}. Evaluate every rung at both fractions, or use "
            "end_rule='law'"
        )
    means = {rung: sum(v) / len(v) for rung, v in falls.items()}
    fall = sum(means.values()) / len(means)
    sd = statistics.stdev(every)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    one_run, mean_of_seeds = z * sd * math.sqrt(1 + 1 / len(every)), z * sd / math.sqrt(len(every))
    point = anchor["point"] - fall
    by_compute = {}
    for r in runs:
        if r["rung"] in falls:
            by_compute[anchor["fraction"] * float(r["compute_6nd"])] = r["rung"]
    loo = []
    for row in anchor.get("loo") or []:
        left = next(
            (rung for c, rung in by_compute.items() if math.isclose(c, row["left_out"], rel_tol=1e-6)), None
        )
        if left is None:
            raise ValueError(
                f"prediction: the anchor's leave-one-rung-out row at compute {row['left_out']:.4g} matches "
                f"no rung with a fall (rungs at {sorted(by_compute)}): the fit and its runs disagree"
            )
        rest = [m for rung, m in means.items() if rung != left]
        loo.append(
            {
                "left_out": row["left_out"],
                "rung": left,
                "prediction": row["prediction"] - sum(rest) / len(rest),
            }
        )
    spread = (max(r["prediction"] for r in loo) - min(r["prediction"] for r in loo)) if loo else None
    return {
        "point": point,
        "low": point - math.hypot(anchor["point"] - anchor["low"], one_run),
        "high": point + math.hypot(anchor["high"] - anchor["point"], one_run),
        "low_mean": point - math.hypot(anchor["point"] - anchor["low_mean"], mean_of_seeds),
        "high_mean": point + math.hypot(anchor["high_mean"] - anchor["point"], mean_of_seeds),
        "trainer_flops_axis": anchor["trainer_flops_axis"] - fall,
        "loo": loo,
        "loo_spread": spread,
        "loo_spread_rel": None if spread is None else spread / point,
        "rule": {
            "id": "pre_decay_anchor",
            "anchor": anchor["label"],
            "formula": f"L_end = L_{anchor['label']} (the law at the target's {anchor['label']}) - mean fall",
            "fall_mean": fall,
            "fall_sd": sd,
            "rung_falls": means,
            "runs": len(every),
            "interval": f"the anchor's interval and {z:.3f} x the runs' fall sd (x sqrt(1 + 1/runs) for one "
            "run, / sqrt(runs) for the mean over seeds), added in quadrature",
        },
    }


def late_drop_gate(points: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The target's fall between its last two scored points as the forecast implies it (point at the one
    before minus point at the end), against each rung's measured fall there (the mean over its seeds, the
    rule's runs only). ``flag`` when the forecast's fall is larger than every rung's: the end law then
    extrapolates a late gain no rung showed. In the third to eighth real ladders (the ones whose rungs'
    curves are on record) no target fell from 75% to 100% (the WSD decay) by more than the top rungs did;
    every one of those forecasts implied a larger fall and ended 1.9-9.2% below its target
    (benchmarks/ladder_end_rules.py re-checks this on the records)."""
    if len(points) < 2:
        return None
    prev, end = points[-2], points[-1]
    falls = rung_falls(runs, prev["fraction"], end["fraction"])
    if not falls:
        return None
    rungs = {rung: sum(v) / len(v) for rung, v in falls.items()}
    top = max(rungs, key=lambda rung: rungs[rung])
    implied = prev["point"] - end["point"]
    return {
        "from": prev["label"],
        "implied": implied,
        "rungs": rungs,
        "rung_max": top,
        "flag": implied > rungs[top],
    }


def ladder_warnings(
    points: list[dict[str, Any]], lr_check: dict[str, Any] | None, loo_spread_limit: float
) -> list[str]:
    """The gates that flagged, in words, for the record and its comment (recorded, not enforced: a person
    decides whether to run the target anyway). Only the endpoint's leave-one-rung-out spread is gated: at
    the early points the schedule, not the law, dominates (every real ladder missed at 25%)."""
    out = []
    for p in points:
        gates = p.get("gates") or {}
        if gates.get("residual_flag"):
            out.append(f"{p['label']}: a residual of {gates['max_abs_residual_sigmas']:.1f} sigma (above 3)")
        back = gates.get("backtest_top_rung") or {}
        if back.get("flag"):
            out.append(f"{p['label']}: the fit without the top rung misses it by {back['error']:+.1%}")
    end = points[-1]
    late = (end.get("gates") or {}).get("late_drop") or {}
    if late.get("flag"):
        top = late["rung_max"]
        out.append(
            f"{end['label']}: the forecast has the target falling by {late['implied']:.3f} from "
            f"{late['from']} to the end, more than any rung fell there (at most {late['rungs'][top]:.3f}, "
            f"{top}): the end law extrapolates a late gain no rung showed"
        )
    if end.get("loo_spread_rel") is not None and end["loo_spread_rel"] > loo_spread_limit:
        out.append(
            f"{end['label']}: leaving one rung out moves the prediction over {end['loo_spread_rel']:.1%} of "
            f"the point (limit {loo_spread_limit:.0%}): the law is not pinned down by the rungs"
        )
    for rung, v in sorted(((lr_check or {}).get("by_rung") or {}).items()):
        if not v["ok"]:
            seeds = v.get("seeds", 1)
            noise = (
                f"; the rule's mean has a standard error of {v['mean_se']:.1%}, so a gap under about "
                f"{math.sqrt(2) * v['mean_se']:.1%} is the seeds' noise"
                if "mean_se" in v
                else ""
            )
            out.append(
                f"learning-rate check at {rung}: the rule is {v['rule_gap']:.1%} worse than the best "
                f"multiple tried ({seeds} seed{'s' if seeds != 1 else ''}{noise})"
            )
    return out


def predict_target(config: PredictionConfig) -> dict[str, Any]:
    """Write the sealed prediction record; return it."""
    fit_record = read_json(f"{config.fit.rstrip('/')}/{FIT_FILE}")
    fit_sha = hashlib.sha256(read_bytes(f"{config.fit.rstrip('/')}/{FIT_FILE}")).hexdigest()
    t = config.target
    if len(t.eval_steps) != len(fit_record["fractions"]):
        raise ValueError(
            f"prediction: the target has {len(t.eval_steps)} eval steps but the fit has "
            f"{len(fit_record['fractions'])} fractions; they must match one to one"
        )
    points = []
    for step, entry in zip(t.eval_steps, fit_record["fractions"], strict=True):
        tokens = step * t.tokens_per_step
        c6, ct = 6.0 * t.n_params * tokens, t.flops_per_token * tokens
        fit, alt = ScalingFit.from_json(entry["fit"]), ScalingFit.from_json(entry["fit_trainer_flops"])
        loo = fit.loo(c6)
        spread = (max(r["prediction"] for r in loo) - min(r["prediction"] for r in loo)) if loo else None
        point = _point(fit, c6)
        points.append(
            {
                "label": f"{entry['fraction']:.0%}",
                "fraction": entry["fraction"],
                "step": step,
                "tokens": tokens,
                "compute_6nd": c6,
                "compute_trainer": ct,
                **point,
                "trainer_flops_axis": alt.point(ct),
                "loo": loo,
                "loo_spread": spread,
                "loo_spread_rel": None if spread is None else spread / point["point"],
                "params": entry["fit"]["params"],
                "sigma_log": entry["fit"]["sigma_log"],
                "gates": entry["gates"],
            }
        )
    settings = fit_record["fractions"][0]["fit"]["settings"]
    end_rule = None
    if config.end_rule == "pre_decay_anchor":
        end = points[-1]
        law = {
            k: end[k]
            for k in (
                "point",
                "low",
                "high",
                "low_mean",
                "high_mean",
                "trainer_flops_axis",
                "loo",
                "loo_spread",
                "loo_spread_rel",
            )
        }
        law["late_drop"] = late_drop_gate(points, fit_record["runs"])
        anchored = anchored_end(points, fit_record["runs"], float(settings["level"]))
        end_rule = anchored.pop("rule")
        end.update(anchored, end_law=law)
    late = late_drop_gate(points, fit_record["runs"])
    if late is not None:
        points[-1]["gates"] = {**points[-1]["gates"], "late_drop": late}
    record = {
        "schema": PREDICTION_SCHEMA,
        "experiment": config.experiment,
        "issue": config.issue,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "metric": {
            "name": fit_record["metric"],
            "path": f"eval.{fit_record['metric']}",
            "scored": "the target's eval step (curve.json) at each point; the final point is after the decay",
        },
        "points": points,
        "target": dataclasses.asdict(t),
        "form": {
            "id": "offset_power_law",
            "formula": "L = E + A * C^(-alpha)",
            "x": "C = 6 * N * D",
            "n": "non-embedding active parameters",
            "alternative_x": "trainer FLOPs per token * tokens",
            "end_rule": config.end_rule,
        },
        "end_rule": end_rule,
        "fitter": {
            "module": "operators.scaling.fit",
            "loss": "summed Huber on log L",
            **settings,
            "interval": fit_record["fractions"][0]["fit"].get("interval", PERCENTILE)
            + "; low/high: one new run (its noise in the pivot), low_mean/high_mean: the mean over seeds",
            "fixed_e_assumed": settings["fixed_e"] is not None,
        },
        "inputs": fit_record["runs"],
        "fit_sha256": fit_sha,
        "lr_check": fit_record["lr_check"],
        "warnings": ladder_warnings(points, fit_record["lr_check"], config.loo_spread_limit),
        "loo_spread_limit": config.loo_spread_limit,
        "scoring": "signed relative error (predicted - actual) / actual; hit = actual inside the interval",
        "interval_covers": "one run at the target's seed (the target is a single run)",
        "assumptions": list(config.assumptions),
    }
    sealed = write_record(f"{config.output_path.rstrip('/')}/{PREDICTION_FILE}", record)
    end = points[-1]
    print(
        f"[prediction] {t.name}: {fit_record['metric']} {end['point']:.4f} "
        f"[{end['low']:.4f}, {end['high']:.4f}] at step {end['step']}; sha256 {sealed[HASH_KEY]}",
        file=sys.stderr,
        flush=True,
    )
    return {"record_sha256": sealed[HASH_KEY], "point": end["point"], "low": end["low"], "high": end["high"]}


@dataclasses.dataclass(frozen=True)
class TargetTrainConfig:
    train: TrainConfig
    """The target's training run (its output_path is this step's)."""
    prediction: str
    """The prediction step's output path."""
    target_config_hash: str
    """Must equal the record's target.config_hash."""
    require_posted: bool = True
    """Wait for the engine's posted.json (the record is on the issue) before training."""
    post_timeout_s: float = runtime_field(default=600.0)
    """How long to wait for posted.json."""


def _wait_posted(prediction: str, sha: str, timeout_s: float) -> dict[str, Any]:
    path = f"{prediction.rstrip('/')}/{POSTED_FILE}"
    deadline = time.time() + timeout_s
    while True:
        try:
            posted = read_json(path)
            if isinstance(posted, dict) and posted.get(HASH_KEY) == sha:
                return posted
        except (FileNotFoundError, ValueError):
            pass
        if time.time() > deadline:
            raise TimeoutError(
                f"target: the prediction {sha[:12]} was not posted to its issue within "
                f"{timeout_s:.0f} s (no {path} naming it). The issue-tracker publisher posts it "
                "when the prediction step succeeds; check the run's publisher errors, or set "
                "require_posted=False for a ladder without an issue"
            )
        time.sleep(0.25)


def train_target(config: TargetTrainConfig) -> dict[str, Any]:
    """Check the frozen forecast, wait until it is posted, record what is tracked, then train."""
    record_path = f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}"
    record = read_record(record_path)
    if record["target"]["config_hash"] != config.target_config_hash:
        raise ValueError(
            f"target: the prediction names config {record['target']['config_hash']} but this target "
            f"is {config.target_config_hash}: the config changed after the forecast; re-run the "
            "prediction for the new config (a new record) instead of scoring an old one"
        )
    posted = (
        _wait_posted(config.prediction, record[HASH_KEY], config.post_timeout_s)
        if config.require_posted
        else None
    )
    out = config.train.output_path.rstrip("/")
    from moe_trainer.data.cache import write_json_atomic

    write_json_atomic(
        f"{out}/{TRACKING_FILE}",
        {
            "schema": TRACKING_SCHEMA,
            "prediction": f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}",
            HASH_KEY: record[HASH_KEY],
            "metrics_file": "metrics.jsonl",
            "metric_path": record["metric"]["path"],
            "posted": posted,
        },
    )
    return train(with_eval_band(config.train, record, record_path))


@dataclasses.dataclass(frozen=True)
class AfterForecastConfig:
    train: TrainConfig
    """The run (its output_path is this step's)."""
    prediction: str
    """The prediction step's output path: the run starts only once the forecast is frozen."""
    require_posted: bool = True
    """Also wait for the engine's posted.json (the record is on the issue), as the target does."""
    post_timeout_s: float = runtime_field(default=600.0)
    """How long to wait for posted.json."""


def train_after_forecast(config: AfterForecastConfig) -> dict[str, Any]:
    """Train a run that must not start before the forecast is frozen and posted, such as the target at
    another learning rate: the record is read (its hash checked) first; the forecast's tracking does not
    apply (no tracking.json, no band alert)."""
    record = read_record(f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}")
    if config.require_posted:
        _wait_posted(config.prediction, record[HASH_KEY], config.post_timeout_s)
    return train(config.train)


@dataclasses.dataclass(frozen=True)
class VerdictConfig:
    output_path: str
    """Where verdict.json is written."""
    prediction: str
    """The prediction step's output path."""
    target_curve: str
    """The target's eval step output path (curve.json)."""


def score_prediction(config: VerdictConfig) -> dict[str, Any]:
    """Score the frozen record against the target's curve; write the sealed verdict.json and return it."""
    record = read_record(f"{config.prediction.rstrip('/')}/{PREDICTION_FILE}")
    curve_path = f"{config.target_curve.rstrip('/')}/{CURVE_FILE}"
    curve = read_json(curve_path)
    actual_by_step = {int(p["step"]): float(p["value"]) for p in curve["points"]}
    rows = []
    for p in record["points"]:
        if p["step"] not in actual_by_step:
            raise ValueError(
                f"verdict: the target's curve {curve_path} has no evaluation at step {p['step']} "
                f"(it has {sorted(actual_by_step)})"
            )
        actual = actual_by_step[p["step"]]
        rows.append(
            {
                "label": p["label"],
                "step": p["step"],
                "actual": actual,
                "point": p["point"],
                "low": p["low"],
                "high": p["high"],
                "error_pct": 100.0 * (p["point"] - actual) / actual,
                "inside": bool(p["low"] <= actual <= p["high"]) and math.isfinite(actual),
            }
        )
        if "end_law" in p:  # the pre_decay_anchor rule: the end law's own forecast, scored beside it
            law = p["end_law"]
            rows[-1]["end_law"] = {
                "point": law["point"],
                "error_pct": 100.0 * (law["point"] - actual) / actual,
                "inside": bool(law["low"] <= actual <= law["high"]) and math.isfinite(actual),
            }
    verdict = {
        "schema": VERDICT_SCHEMA,
        "prediction_sha256": record[HASH_KEY],
        "experiment": record["experiment"],
        "issue": record["issue"],
        "metric": record["metric"]["name"],
        "target": record["target"]["name"],
        "points": rows,
        "endpoint": rows[-1],
        "hits": sum(r["inside"] for r in rows),
        "n": len(rows),
        "curve_sha256": hashlib.sha256(read_bytes(curve_path)).hexdigest(),
        "scored_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    sealed = write_record(f"{config.output_path.rstrip('/')}/{VERDICT_FILE}", verdict)
    end = rows[-1]
    print(
        f"[verdict] {record['target']['name']}: actual {end['actual']:.4f}, predicted {end['point']:.4f} "
        f"({end['error_pct']:+.2f}%), {'inside' if end['inside'] else 'OUTSIDE'} [{end['low']:.4f}, "
        f"{end['high']:.4f}]; {verdict['hits']}/{verdict['n']} points inside",
        file=sys.stderr,
        flush=True,
    )
    return sealed
