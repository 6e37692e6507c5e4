"""A step's numbers as tables and a chart, for its page (dashboard and static site alike): the final
training values, a server-rendered loss curve (optional EMA smoothing, hover via static/compare.js),
per-domain bits per byte and loss from eval.json, and multiple-choice accuracy ± standard error from
choices.json. Rendered by templates/_step_results.html (`res`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin.compare.charts import LineChart, line_chart
from marin.compare.curves import curve_set
from marin.compare.runs import Run, StepRef
from marin.compare.source import Source, number
from marin.compare.table import last_values


@dataclass(frozen=True)
class DomainRow:
    domain: str
    bpb: float | None
    loss: float | None
    tokens: float | None
    bytes: float | None
    bpb_stderr: float | None = None  # over documents (eval.json's optional bpb_stderr, loss_stderr)
    loss_stderr: float | None = None
    documents: float | None = None


@dataclass(frozen=True)
class ChoiceRow:
    task: str
    items: float | None
    chance: float | None
    scores: tuple[tuple[str, float | None, float | None], ...]  # (metric, value, stderr)


@dataclass(frozen=True)
class StepView:
    final: tuple[tuple[str, float], ...] = ()
    charts: tuple[LineChart, ...] = ()
    domains: tuple[DomainRow, ...] = ()
    summary: tuple[DomainRow, ...] = ()  # micro and macro
    choices: tuple[ChoiceRow, ...] = ()
    ema: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def empty(self) -> bool:
        return not (self.final or self.domains or self.choices)


FINAL_ORDER = ("step", "loss", "ce_loss", "grad_norm", "update_norm", "lr", "tokens_per_s", "mfu", "aux_loss",
               "drop_rate", "load_imbalance", "skipped_total")


def _domain(name: str, row: Any) -> DomainRow:
    row = row if isinstance(row, dict) else {}
    return DomainRow(name, number(row.get("bpb")), number(row.get("loss")), number(row.get("tokens")),
                     number(row.get("bytes")), number(row.get("bpb_stderr")), number(row.get("loss_stderr")),
                     number(row.get("documents")))


def _choices(doc: Any) -> tuple[ChoiceRow, ...]:
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    rows = []
    for task, row in sorted((tasks or {}).items()):
        if isinstance(row, dict):
            scores = tuple((k, number(row.get(k)), number(row.get(f"{k}_stderr")))
                           for k in ("acc", "acc_norm", "acc_bytes") if k in row)
            rows.append(ChoiceRow(str(task), number(row.get("items")), number(row.get("chance")), scores))
    return tuple(rows)


def step_view(source: Source, rel: str, name: str, *, ema: float | None = None,
              metrics: tuple[str, ...] = ("loss",)) -> StepView:
    cols = source.columns(f"{rel}/metrics.jsonl")
    final: tuple[tuple[str, float], ...] = ()
    charts: tuple[LineChart, ...] = ()
    if cols is not None:
        last = last_values(cols)
        final = tuple((k, last[k]) for k in FINAL_ORDER if k in last)
        run = Run(label=name, kind="step", steps=(StepRef(name, "", rel),))
        charts = tuple(line_chart(curve_set(source, [run], m, ema=ema)) for m in metrics if m in cols.series)
    ev = source.read_json(f"{rel}/eval.json")
    domains: tuple[DomainRow, ...] = ()
    summary: tuple[DomainRow, ...] = ()
    if isinstance(ev, dict):
        domains = tuple(_domain(d, r) for d, r in sorted((ev.get("domains") or {}).items()))
        summary = tuple(_domain(k, ev.get(k)) for k in ("micro", "macro") if isinstance(ev.get(k), dict))
    return StepView(final, charts, domains, summary, _choices(source.read_json(f"{rel}/choices.json")), ema)
