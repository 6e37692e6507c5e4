"""Every final and eval metric of a run, and the table that sets runs side by side.

A run's metrics come from its steps' records (docs/formats.md), keyed so that the same quantity lines up
across runs whatever the steps are called:

- `train:{key}`: the last training row of metrics.jsonl (`loss`, `ce_loss`, `grad_norm`, ...; `train:step`
  is the number of updates), and a train step's own eval.json as `train:eval.{path}`;
- `eval:{path}`: an eval step's eval.json (`eval:domains.python.bpb`, `eval:macro.bpb`; bits per byte and
  loss, not the token and byte counts), with their standard errors over documents where the record has them
  (`bpb_stderr`, `loss_stderr`: moe_trainer.evaluate);
- `choices:{task}.{metric}`: a multiple-choice step's choices.json (`acc`, `acc_norm`, `acc_bytes`), with
  their standard errors (`acc_stderr`: sample std / sqrt(n) over the items).

When one run has two steps giving the same key, the second one's key gets `[{step name}]`.

The difference is each run's value minus the first run's (the baseline). Its standard error is
sqrt(se_a² + se_b²) when both values carry one (independent item samples); none is invented where the
records give none (eval.json records per-domain sums, not per-document values, so bits per byte carry no
standard error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from marin.compare.runs import Run
from marin.compare.source import Columns, Source, number

TRAIN_FINAL = ("loss", "ce_loss", "grad_norm", "update_norm", "tokens_per_s", "mfu", "aux_loss", "drop_rate",
               "load_imbalance", "skipped_total")
EVAL_KEYS = ("bpb", "loss")
CHOICE_KEYS = ("acc", "acc_norm", "acc_bytes")
_EVAL_LEAVES = (*EVAL_KEYS, *(f"{k}_stderr" for k in EVAL_KEYS))


@dataclass(frozen=True)
class Value:
    value: float
    stderr: float | None = None
    step: str = ""  # the step it was read from


@dataclass(frozen=True)
class Row:
    """One metric across runs: values (None where a run lacks it), differences vs the first run."""

    key: str
    values: tuple[Value | None, ...]
    diffs: tuple[float | None, ...]
    diff_stderrs: tuple[float | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.key,
                "values": [None if v is None else {"value": v.value, "stderr": v.stderr, "step": v.step}
                           for v in self.values],
                "diff": list(self.diffs), "diff_stderr": list(self.diff_stderrs)}


def _leaves(doc: Any, path: str, out: dict[str, float], keys: tuple[str, ...] = EVAL_KEYS) -> None:
    """Every number of the nested dict `doc` whose dotted path ends in one of `keys`, by that path."""
    if not isinstance(doc, dict):
        return
    for k, v in doc.items():
        p = f"{path}.{k}" if path else str(k)
        if isinstance(v, dict):
            _leaves(v, p, out, keys)
        elif p.rsplit(".", 1)[-1] in keys and (n := number(v)) is not None:
            out[p] = n


def last_values(cols: Columns) -> dict[str, float]:
    """The last non-empty value of every series (the final training metrics), and `step`."""
    out = {}
    for key, col in cols.series.items():
        for v in reversed(col):
            if v is not None:
                out[key] = v
                break
    last_step = next((s for s in reversed(cols.steps) if s is not None), None)
    if last_step is not None:
        out["step"] = last_step
    return out


def step_metrics(source: Source, rel: str, name: str, *, curves: bool = True) -> dict[str, Value]:
    """The metrics one step's records give (keys as in the module docstring). `curves=False` reads no
    metrics.jsonl (a list of many experiments): the final training loss then comes from train_result.json."""
    out: dict[str, Value] = {}
    cols = source.columns(f"{rel}/metrics.jsonl") if curves else None
    result = None if curves else source.read_json(f"{rel}/train_result.json")
    train = cols is not None or isinstance(result, dict)
    if cols is not None:
        final = last_values(cols)
        for key in ("step", *TRAIN_FINAL):
            if key in final:
                out[f"train:{key}"] = Value(final[key], step=name)
    elif isinstance(result, dict):
        for key in ("step", "loss"):
            if (v := number(result.get(key))) is not None:
                out[f"train:{key}"] = Value(v, step=name)
    ev = source.read_json(f"{rel}/eval.json")
    if isinstance(ev, dict):
        found: dict[str, float] = {}  # the values and eval.json's optional standard errors (`bpb_stderr`)
        _leaves({k: v for k, v in ev.items() if k in ("domains", "micro", "macro")}, "", found, _EVAL_LEAVES)
        for path, v in found.items():
            if path.rsplit(".", 1)[-1] in EVAL_KEYS:
                out[f"train:eval.{path}" if train else f"eval:{path}"] = Value(v, found.get(f"{path}_stderr"),
                                                                               step=name)
    ch = source.read_json(f"{rel}/choices.json")
    tasks = ch.get("tasks") if isinstance(ch, dict) else None
    for task, row in (tasks or {}).items():
        if not isinstance(row, dict):
            continue
        for key in CHOICE_KEYS:
            acc = number(row.get(key))
            if acc is not None:
                out[f"choices:{task}.{key}"] = Value(acc, number(row.get(f"{key}_stderr")), step=name)
    return out


def run_metrics(source: Source, run: Run) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for ref in run.steps:
        for key, value in step_metrics(source, ref.rel, ref.name).items():
            out[key if key not in out else f"{key}[{ref.name}]"] = value
    return out


def metric_order(key: str) -> tuple[int, str]:
    return ({"eval": 0, "choices": 1, "train": 2}.get(key.split(":", 1)[0], 3), key)


def metric_rows(per_run: list[dict[str, Value]]) -> list[Row]:
    """The side-by-side table: every key any run has, eval first, then multiple choice, then training."""
    keys = sorted({k for m in per_run for k in m}, key=metric_order)
    rows = []
    for key in keys:
        values = tuple(m.get(key) for m in per_run)
        base = values[0]
        diffs: list[float | None] = []
        ses: list[float | None] = []
        for v in values:
            if base is None or v is None:
                diffs.append(None)
                ses.append(None)
                continue
            diffs.append(v.value - base.value)
            both = v.stderr is not None and base.stderr is not None
            ses.append(math.sqrt(v.stderr ** 2 + base.stderr ** 2) if both else None)  # type: ignore[operator]
        rows.append(Row(key, values, tuple(diffs), tuple(ses)))
    return rows
