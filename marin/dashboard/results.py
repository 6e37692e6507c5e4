"""Numbers where people look: the verdict and headline metrics of the experiments list, and an experiment's
results (its own steps' final and eval metrics) and baseline, all from marin.compare (the same reading
`marin compare` and `marin status` do)."""

from __future__ import annotations

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


def source(dash: Dashboard) -> DashboardSource:
    return DashboardSource(dash.store, dash.metrics, dash.experiments)


def with_headline(dash: Dashboard, summary: ExperimentSummary) -> ExperimentSummary:
    h = headline(source(dash), summary.id, dash.experiments.owners())
    metrics = [HeadlineMetric(name=m.name, value=m.value, stderr=m.stderr) for m in h.metrics]
    return summary.model_copy(update={"verdict": h.outcome, "headline": metrics})


def with_results(dash: Dashboard, detail: ExperimentDetail) -> ExperimentDetail:
    """The detail with its verdict, headline, baseline and its own steps' results (eval and multiple-choice,
    and the final training loss of train_result.json; no metrics.jsonl is parsed for this page)."""
    src, owner = source(dash), dash.experiments.owners()
    results = []
    for ref in own_steps(src, detail.id, owner):
        values = step_metrics(src, ref.rel, ref.name, curves=False)  # the step page has the curves
        if values:
            results.append(StepResult(name=ref.name, path=ref.rel, values=[
                ResultValue(metric=k, value=v.value, stderr=v.stderr) for k, v in values.items()]))
    summary = with_headline(dash, detail)
    return detail.model_copy(update={"verdict": summary.verdict, "headline": summary.headline,
                                     "baseline": baseline_of(src, detail.id, owner), "results": results})
