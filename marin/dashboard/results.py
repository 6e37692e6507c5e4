"""Numbers where people look: the verdict and headline metrics of the experiments list, and an experiment's
results (its own steps' final and eval metrics) and baseline, all from marin.compare (the same reading
`marin compare` and `marin status` do).

Cached per experiment, as the alert index is (marin/dashboard/alerts.py): an experiment's own steps only
write while a run of it is RUNNING, and a run's start and end rewrite its manifest. So what was computed is
reused while the manifest's signature is the same, no run of it is RUNNING, and its verdicts.json is the
same parsed object in the store's cache (a person's verdict changes it); a list page of 25 experiments then
costs 25 cached reads instead of one per own step and record file."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from marin.compare.headline import headline
from marin.compare.runs import baseline_of, own_steps
from marin.compare.table import step_metrics
from marin.dashboard.compare_source import DashboardSource
from marin.dashboard.context import Dashboard
from marin.dashboard.schemas import (
    ExperimentDetail,
    ExperimentSummary,
    HeadlineMetric,
    ResultValue,
    StepResult,
)
from marin.status.manifest import EXPERIMENTS_DIR


def source(dash: Dashboard) -> DashboardSource:
    return DashboardSource(dash.store, dash.metrics, dash.experiments)


@dataclass(frozen=True)
class _Numbers:
    verdict: str | None
    headline: list[HeadlineMetric]
    results: list[StepResult]
    baseline: str | None


_CACHE: dict[tuple[int, str], tuple[Any, Any, _Numbers]] = {}
_LOCK = threading.Lock()


def _compute(dash: Dashboard, experiment_id: str) -> _Numbers:
    src, owner = source(dash), dash.experiments.owners()
    h = headline(src, experiment_id, owner)
    results = []
    for ref in own_steps(src, experiment_id, owner):
        values = step_metrics(src, ref.rel, ref.name, curves=False)  # the step page has the curves
        if values:
            results.append(StepResult(name=ref.name, path=ref.rel, values=[
                ResultValue(metric=k, value=v.value, stderr=v.stderr) for k, v in values.items()]))
    metrics = [HeadlineMetric(name=m.name, value=m.value, stderr=m.stderr) for m in h.metrics]
    return _Numbers(h.outcome, metrics, results, baseline_of(src, experiment_id, owner))


def numbers(dash: Dashboard, experiment_id: str) -> _Numbers:
    """An experiment's verdict, headline, results and baseline (cached: see the module docstring)."""
    found = dash.experiments.manifest(experiment_id)
    running = found is not None and any(
        isinstance(r, dict) and r.get("status") == "RUNNING" for r in found[0].get("runs") or [])
    sig = dash.experiments.signature_of(experiment_id)
    verdicts = dash.store.read_json(f"{EXPERIMENTS_DIR}/{experiment_id}/verdicts.json")
    key = (id(dash), experiment_id)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None and not running and hit[0] == sig and hit[1] is verdicts:
        return hit[2]
    value = _compute(dash, experiment_id)
    with _LOCK:
        _CACHE[key] = (sig, verdicts, value)
    return value


def with_headline(dash: Dashboard, summary: ExperimentSummary) -> ExperimentSummary:
    n = numbers(dash, summary.id)
    return summary.model_copy(update={"verdict": n.verdict, "headline": n.headline})


def with_results(dash: Dashboard, detail: ExperimentDetail) -> ExperimentDetail:
    """The detail with its verdict, headline, baseline and its own steps' results (eval and multiple-choice,
    and the final training loss of train_result.json; no metrics.jsonl is parsed for this page)."""
    n = numbers(dash, detail.id)
    return detail.model_copy(update={"verdict": n.verdict, "headline": n.headline, "baseline": n.baseline,
                                     "results": n.results})
