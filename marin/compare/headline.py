"""An experiment's headline: its verdict and the numbers that decide it, or its main result when it has no
verdict. Used by the dashboard's experiments list and experiment page, and by `marin status`.

`headline(source, experiment_id)` returns the current verdict (outcome, who set it, the deciding line of
marin/status/verdicts.py) and up to three metrics: the criteria's measured values when a verdict was
computed; otherwise, from the experiment's own steps (marin/compare/runs.py), each eval step's macro bits per
byte, each multiple-choice task's accuracy (± its standard error), or the final training loss (from
train_result.json: a headline never parses a metrics.jsonl, so a list of 25 experiments stays cheap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin.compare.runs import StepRef, own_steps
from marin.compare.source import Source, number
from marin.compare.table import Value, step_metrics
from marin.status.manifest import EXPERIMENTS_DIR
from marin.status.verdicts import deciding

PREFERRED = ("eval:macro.bpb", "eval:micro.bpb", "train:eval.macro.bpb", "train:loss")


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    stderr: float | None = None

    def text(self) -> str:
        se = f" ± {self.stderr:.3g}" if self.stderr is not None else ""
        return f"{self.name} {self.value:.4g}{se}"


@dataclass(frozen=True)
class Headline:
    outcome: str | None = None  # the current verdict's outcome, None when there is none
    by: str | None = None
    deciding: str = ""
    metrics: tuple[Metric, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "by": self.by, "deciding": self.deciding,
                "metrics": [{"name": m.name, "value": m.value, "stderr": m.stderr} for m in self.metrics]}


def _verdict(source: Source, experiment_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    doc = source.read_json(f"{EXPERIMENTS_DIR}/{experiment_id}/verdicts.json")
    if not isinstance(doc, dict):
        return None, []
    current = doc.get("current")
    history = [e for e in doc.get("history") or [] if isinstance(e, dict)]
    return (current if isinstance(current, dict) else None), history


StepValues = list[tuple[StepRef, dict[str, Value]]]


def own_values(source: Source, experiment_id: str, owner: dict[str, str] | None = None) -> StepValues:
    """Each own step's metrics, metrics.jsonl left unread (`step_metrics(curves=False)`)."""
    return [(ref, step_metrics(source, ref.rel, ref.name, curves=False))
            for ref in own_steps(source, experiment_id, owner)]


def _own_metrics(step_values: StepValues) -> list[Metric]:
    found: list[Metric] = []
    for ref, values in step_values:
        key = next((k for k in PREFERRED if k in values), None)
        if key is not None:
            found.append(Metric(f"{ref.name}:{key.split(':', 1)[1]}", values[key].value))
        for k, v in values.items():
            if k.startswith("choices:") and k.endswith(".acc"):
                found.append(Metric(f"{ref.name}:{k.split(':', 1)[1]}", v.value, v.stderr))
    evals = [m for m in found if "bpb" in m.name or "acc" in m.name]
    return (evals or found)[:3]


def headline(source: Source, experiment_id: str, owner: dict[str, str] | None = None,
             step_values: StepValues | None = None) -> Headline:
    """The experiment's verdict and headline metrics (see the module docstring); `step_values`: its
    `own_values`, when the caller has them already."""
    current, history = _verdict(source, experiment_id)
    criteria: list[Any] = (current or {}).get("criteria") or next(
        (e.get("criteria") for e in reversed(history) if e.get("criteria")), [])
    metrics = tuple(Metric(str(c.get("metric")), v) for c in criteria
                    if isinstance(c, dict) and (v := number(c.get("value"))) is not None)[:3]
    if not metrics:
        found = step_values if step_values is not None else own_values(source, experiment_id, owner)
        metrics = tuple(_own_metrics(found))
    if current is None:
        return Headline(metrics=metrics)
    return Headline(outcome=str(current.get("outcome")), by=str(current.get("by") or ""),
                    deciding=deciding(current, history), metrics=metrics)
