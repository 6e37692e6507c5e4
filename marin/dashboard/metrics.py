"""Trainer metrics for the step page's charts, read incrementally from `metrics.jsonl`.

metrics.jsonl is append-only and can reach hundreds of thousands of rows. Each file is parsed once into
compact columns; on the next request only the bytes appended since (up to the last complete line) are read, so
a page polling a running training step costs one stat and a small read. A file that shrank or was rewritten is
read again from the start. Responses are downsampled to `max_points` rows (evenly spaced, the last row always
kept).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from marin.compare.source import Columns
from marin.dashboard.schemas import EvalPoint, ExpertLoad, Metrics
from marin.dashboard.store import PrefixStore, signature

SERIES = (
    "loss",
    "lr",
    "grad_norm",
    "update_norm",
    "tokens_per_s",
    "mfu",
    "aux_loss",
    "router_z_loss",
    "drop_rate",
)
_CHUNK = 8 << 20


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if v == v and v not in (float("inf"), float("-inf")) else None  # JSON has no NaN/inf


@dataclass
class _Columns(Columns):
    """marin.compare's columns (every numeric key of the training rows, for the compare view) plus what the
    step page shows besides curves: the latest expert load and the eval rows."""

    signature: Any = None
    consumed: int = 0
    expert_load: ExpertLoad | None = None
    evals: list[EvalPoint] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        step = _num(row.get("step"))
        if isinstance(row.get("eval"), dict):
            domains = row["eval"].get("domains")
            if isinstance(domains, dict):
                self.evals.append(
                    EvalPoint(step=None if step is None else int(step), domains=_domains(domains))
                )
        if "loss" not in row and "lr" not in row:
            return  # an eval-only row
        super().add(row)
        load = row.get("expert_load")
        if isinstance(load, list) and load and all(isinstance(x, list) for x in load):
            ent = row.get("routing_entropy")
            self.expert_load = ExpertLoad(
                step=None if step is None else int(step),
                layers=[[_num(v) or 0.0 for v in layer] for layer in load],
                routing_entropy=[_num(v) or 0.0 for v in ent] if isinstance(ent, list) else None,
            )


def _domains(domains: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    return {
        str(d): {k: _num(v) for k, v in vals.items()} for d, vals in domains.items() if isinstance(vals, dict)
    }


class MetricsReader:
    def __init__(self, store: PrefixStore):
        self.store = store
        self._files: dict[str, _Columns] = {}
        self._lock = threading.Lock()

    def _columns(self, rel: str) -> _Columns | None:
        info = self.store.info(rel)
        if info is None:
            return None
        with self._lock:
            cols = self._files.get(rel)
            size = int(info.get("size") or 0)
            if cols is None or size < cols.consumed:
                cols = _Columns()
            if cols.signature != signature(info):
                while cols.consumed < size:
                    data, start, _ = self.store.read_range(rel, cols.consumed, _CHUNK, jump=False)
                    end = data.rfind(b"\n") + 1
                    if end == 0:
                        if len(data) >= _CHUNK:
                            raise ValueError(f"{rel}: a line longer than {_CHUNK} bytes at byte {start}")
                        break  # only a partial line is there; it will be complete later
                    for line in data[:end].split(b"\n"):
                        if line.strip():
                            row = json.loads(line)
                            if isinstance(row, dict):
                                cols.add(row)
                    cols.consumed += end
                cols.signature = signature(info)
                self._files[rel] = cols
            return cols

    def columns(self, rel: str) -> Columns | None:
        """metrics.jsonl at `rel` as columns (incrementally read, cached): what marin.compare reads."""
        return self._columns(rel)

    def metrics(self, rel: str, max_points: int) -> Metrics | None:
        cols = self._columns(f"{rel}/metrics.jsonl")
        eval_doc = self.store.read_json(f"{rel}/eval.json")
        if cols is None and not isinstance(eval_doc, dict):
            return None
        cols = cols or _Columns()
        n = len(cols.steps)
        keep = (
            list(range(n))
            if n <= max_points
            else sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
        )
        return Metrics(
            rows=n,
            steps=[cols.steps[i] for i in keep],
            series={k: [v[i] for i in keep] for k in SERIES
                    if (v := cols.series.get(k)) is not None and any(x is not None for x in v)},
            downsampled=len(keep) < n,
            expert_load=cols.expert_load,
            eval_history=cols.evals[-200:],
            eval=eval_doc if isinstance(eval_doc, dict) else None,
        )
