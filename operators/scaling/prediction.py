"""The ``prediction`` step: the fit's laws -> the target's forecast, sealed in ``prediction.json``.

``predict_target`` reads ``fit.json`` and writes a :class:`openlab_records.Prediction` (schema
``marin-prediction/v2``): the metric, the target's evaluation points (step, tokens, 6·N·D and trainer FLOPs),
the point estimate and 90% interval at each (for one run, the target being one run; the interval of the mean
over seeds is kept too), the alternative forecast on the trainer-FLOPs axis, the leave-one-rung-out
predictions, the functional form, fitter and settings, every rung's step hash, curve hash and values, the
target step's config hash, the issue, the assumptions, the gates that flagged (:mod:`.gates`), and a
``summary`` line stating the law (whether E was fitted or fixed, and the endpoint rule: :mod:`.end_rule`),
which the engine posts as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from openlab_records import HASH_KEY, PREDICTION_FILE, Band, Prediction, read_json, write_sealed
from operators.scaling.end_rule import END_RULES, LAW_KEYS, anchored_end, rule_line
from operators.scaling.fit import ScalingFit
from operators.scaling.fitstep import FIT_FILE, read_bytes
from operators.scaling.gates import ladder_gates, late_drop_gate

SCORING = "signed relative error (predicted - actual) / actual; hit = actual inside the interval"
FORM = {
    "id": "offset_power_law",
    "formula": "L = E + A * C^(-alpha)",
    "x": "C = 6 * N * D",
    "n": "non-embedding active parameters",
    "alternative_x": "trainer FLOPs per token * tokens",
}


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
    """How the endpoint is forecast: ``"law"`` or ``"pre_decay_anchor"`` (:mod:`.end_rule`)."""
    ladder: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """What the ladder says about itself, recorded as ``ladder``: the ``recipe`` that trained the runs (and
    its learning-rate reference, ``v2_reference``, for ``delphi-v2`` ladders since the re-tune; older records
    have none) and the ladder's ``compute_share`` of this target
    (``experiments.common.scaling_ladder.ladder_facts``)."""

    def __post_init__(self) -> None:
        if self.end_rule not in END_RULES:
            raise ValueError(
                f"PredictionConfig: end_rule={self.end_rule!r} is not one of {', '.join(END_RULES)}: "
                "'law' fits the end like every point, 'pre_decay_anchor' takes the law at the point before "
                "the end minus the rungs' mean fall from there"
            )


def _forecast_point(step: int, entry: dict[str, Any], t: TargetSpec) -> dict[str, Any]:
    """The forecast at one evaluation step from the fit of the matching fraction."""
    tokens = step * t.tokens_per_step
    c6, ct = 6.0 * t.n_params * tokens, t.flops_per_token * tokens
    fit, alt = ScalingFit.from_json(entry["fit"]), ScalingFit.from_json(entry["fit_trainer_flops"])
    loo = fit.loo(c6)
    spread = (max(r["prediction"] for r in loo) - min(r["prediction"] for r in loo)) if loo else None
    point, low, high = fit.predict(c6, single_run=True)
    _, low_mean, high_mean = fit.predict(c6)
    return {
        "label": f"{entry['fraction']:.0%}",
        "fraction": entry["fraction"],
        "step": step,
        "tokens": tokens,
        "compute_6nd": c6,
        "compute_trainer": ct,
        "point": point,
        "low": low,
        "high": high,
        "low_mean": low_mean,
        "high_mean": high_mean,
        "trainer_flops_axis": alt.point(ct),
        "loo": loo,
        "loo_spread": spread,
        "loo_spread_rel": None if spread is None else spread / point,
        "params": entry["fit"]["params"],
        "sigma_log": entry["fit"]["sigma_log"],
        "model_error_log": fit.model_error_sd(c6),
        "interval_rules": fit.rules,
        "gates": entry["gates"],
    }


def _apply_end_rule(
    points: list[dict[str, Any]], fit_record: dict[str, Any], rule: str
) -> dict[str, Any] | None:
    """Replace the endpoint by the rule's forecast (the end law kept in ``end_law``); the rule's figures."""
    if rule == "law":
        return None
    end = points[-1]
    law = {k: end[k] for k in LAW_KEYS}
    law["late_drop"] = late_drop_gate(points, fit_record["runs"])
    level = float(fit_record["fractions"][0]["fit"]["settings"]["level"])
    anchored = anchored_end(points, fit_record["runs"], level)
    figures: dict[str, Any] = anchored.pop("rule")
    end.update(anchored, end_law=law)
    return figures


def law_line(fixed_e: float | None, end_rule: dict[str, Any] | None, end: dict[str, Any]) -> str:
    """The law in words: its form, whether E was fitted or fixed (an assumption the reader must see), and the
    endpoint rule when it is not the law."""
    e_text = "E fitted" if fixed_e is None else f"E fixed at {fixed_e:g} (an assumption, not fitted)"
    line = f"Law: `{FORM['formula']}` in {FORM['x']}; {e_text}"
    return line if end_rule is None else f"{line}. {rule_line(end_rule, end.get('end_law'))}"


def ladder_lines(ladder: Mapping[str, Any]) -> tuple[str, ...]:
    """The recipe and the compute share in words (nothing for a ladder that did not record them)."""
    if not ladder:
        return ()
    targets = ladder.get("targets") or []
    also = f" (one of {len(targets)} targets forecast by this ladder)" if len(targets) > 1 else ""
    ref = ladder.get("v2_reference")
    recipe = ladder["recipe"] if not ref else (
        f"{ladder['recipe']} at {ref['multiple_of_marin']:g}x Marin's reference "
        f"(lr_base {ref['lr_base']:.4g})")
    return (
        f"Recipe: {recipe}. The ladder's runs cost {ladder['compute_trainer']:.3g} FLOPs, "
        f"{100 * ladder['compute_share']:.1f}% of this target's "
        f"{ladder['target_compute_trainer']:.3g}{also}.",
    )


def _fitter(fit_record: dict[str, Any]) -> dict[str, Any]:
    settings = fit_record["fractions"][0]["fit"]["settings"]
    # every fit.json names its interval (fit steps since 2026-12-02; an older one has no boot_sigma and is
    # refused by ScalingFit.from_json before this is reached)
    interval = fit_record["fractions"][0]["fit"]["interval"]
    return {
        "module": "operators.scaling.fit",
        "loss": "summed Huber on log L",
        **settings,
        "interval": interval
        + "; low/high: one new run (its noise in the pivot), low_mean/high_mean: the mean "
        "over seeds",
        "fixed_e_assumed": settings["fixed_e"] is not None,
    }


def _prediction(
    config: PredictionConfig,
    fit_record: dict[str, Any],
    fit_sha: str,
    points: list[dict[str, Any]],
    end_rule: dict[str, Any] | None,
) -> Prediction:
    fitter = _fitter(fit_record)
    metric = fit_record["metric"]
    flagged = [g for g in ladder_gates(points, fit_record["lr_check"], config.loo_spread_limit) if g.flag]
    return Prediction(
        metric=metric,
        metric_path=f"eval.{metric}",
        metric_details={
            "scored": "the target's eval step (curve.json) at each point; the final point is after the decay"
        },
        target=config.target.name,
        target_config_hash=config.target.config_hash,
        target_details={
            k: v for k, v in dataclasses.asdict(config.target).items() if k not in ("name", "config_hash")
        },
        points=tuple(Band.from_json(p, f"points[{i}]") for i, p in enumerate(points)),
        experiment=config.experiment,
        issue=config.issue,
        assumptions=config.assumptions,
        warnings=tuple(g.message for g in flagged),
        summary=(law_line(fitter["fixed_e"], end_rule, points[-1]), *ladder_lines(config.ladder)),
        details={
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "form": {**FORM, "end_rule": config.end_rule},
            "end_rule": end_rule,
            "fitter": fitter,
            "inputs": fit_record["runs"],
            "fit_sha256": fit_sha,
            "lr_check": fit_record["lr_check"],
            "loo_spread_limit": config.loo_spread_limit,
            "scoring": SCORING,
            "interval_covers": "one run at the target's seed (the target is a single run)",
            **({"ladder": dict(config.ladder)} if config.ladder else {}),
            "interval_rules": points[-1]["interval_rules"],
            "gates_flagged": sorted({g.name for g in flagged}),
        },
    )


def predict_target(config: PredictionConfig) -> dict[str, Any]:
    """Write the sealed prediction record; return its hash and the endpoint's forecast."""
    fit_path = f"{config.fit.rstrip('/')}/{FIT_FILE}"
    fit_record, fit_sha = read_json(fit_path), hashlib.sha256(read_bytes(fit_path)).hexdigest()
    t = config.target
    if len(t.eval_steps) != len(fit_record["fractions"]):
        raise ValueError(
            f"prediction: the target has {len(t.eval_steps)} eval steps but the fit has "
            f"{len(fit_record['fractions'])} fractions; they must match one to one"
        )
    points = [_forecast_point(s, e, t) for s, e in zip(t.eval_steps, fit_record["fractions"], strict=True)]
    end_rule = _apply_end_rule(points, fit_record, config.end_rule)
    late = late_drop_gate(points, fit_record["runs"])
    if late is not None:
        points[-1]["gates"] = {**points[-1]["gates"], "late_drop": late}
    record = _prediction(config, fit_record, fit_sha, points, end_rule)
    sha = write_sealed(f"{config.output_path.rstrip('/')}/{PREDICTION_FILE}", record.to_json())[HASH_KEY]
    end = record.endpoint
    print(
        f"[prediction] {t.name}: {record.metric} {end.point:.4f} [{end.low:.4f}, {end.high:.4f}] at step "
        f"{end.step}; sha256 {sha}",
        file=sys.stderr,
        flush=True,
    )
    return {HASH_KEY: sha, "point": end.point, "low": end.low, "high": end.high}
