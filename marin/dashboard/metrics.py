"""Trainer metrics for the step page's charts, read incrementally from `metrics.jsonl`.

metrics.jsonl is append-only and can reach hundreds of thousands of rows. Each file is parsed once into
compact columns; on the next request only the bytes appended since (up to the last complete line) are read, so
a page polling a running training step costs one stat and a small read. A file that shrank or was rewritten is
read again from the start. Responses are downsampled to `max_points` rows (evenly spaced, the last row always
kept).

The parsed columns are kept in memory, least recently used first out, within a byte budget: 256 MiB unless
`marin dashboard --metrics-cache-mb N` or `MARIN_DASHBOARD_METRICS_CACHE_MB` says otherwise. A file's cost is
the memory its columns take (`_Columns.nbytes`: 8 bytes a slot, 24 more a float, as CPython stores them;
within 20% of what tracemalloc measures, a test checks), of the order of the file's own size. A file whose
columns alone exceed the budget is parsed for the request and not kept, and evicts nothing (the files kept
stay kept).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from marin.compare.source import Columns
from marin.dashboard.lru import ByteLru
from marin.dashboard.schemas import EvalPoint, ExpertLoad, Metrics
from marin.dashboard.store import PrefixStore, signature
from marin.status.damaged import parse_jsonl

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
DEFAULT_CACHE_BYTES = 256 << 20
CACHE_ENV_VAR = "MARIN_DASHBOARD_METRICS_CACHE_MB"
_SLOT, _FLOAT = 8, 24  # a list slot (a pointer) and a float object, in bytes (CPython, 64-bit)


def cache_bytes(mib: float | None = None) -> int:
    """The metrics cache's budget in bytes: `mib` (the CLI flag), else $MARIN_DASHBOARD_METRICS_CACHE_MB, else
    256 MiB. 0 keeps nothing (every request parses its file again)."""
    text = os.environ.get(CACHE_ENV_VAR, "") if mib is None else str(mib)
    if not text:
        return DEFAULT_CACHE_BYTES
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        source = "--metrics-cache-mb" if mib is not None else CACHE_ENV_VAR
        raise ValueError(f"{source}={text!r} is not a size in MiB >= 0; give e.g. 256 (the default) or 0 to "
                         "cache nothing")
    return int(value * (1 << 20))


def _cost(value: float | None) -> int:
    return _SLOT if value is None else _SLOT + _FLOAT


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
    nbytes: int = 0  # the memory the values above take (the module docstring says how it is counted)
    _load_bytes: int = 0

    def add(self, row: dict[str, Any]) -> None:
        step = _num(row.get("step"))
        if isinstance(row.get("eval"), dict):
            domains = row["eval"].get("domains")
            if isinstance(domains, dict):
                point = EvalPoint(step=None if step is None else int(step), domains=_domains(domains))
                self.evals.append(point)
                scores = [v for d in point.domains.values() for v in d.values()]
                self.nbytes += _SLOT + sum(_SLOT + _cost(v) for v in scores)
        if "loss" not in row and "lr" not in row:
            return  # an eval-only row
        before = {k: len(col) for k, col in self.series.items()}
        super().add(row)
        self.nbytes += _cost(self.steps[-1])
        for k, col in self.series.items():
            self.nbytes += sum(_cost(v) for v in col[before.get(k, 0):])
        load = row.get("expert_load")
        if isinstance(load, list) and load and all(isinstance(x, list) for x in load):
            ent = row.get("routing_entropy")
            self.expert_load = ExpertLoad(
                step=None if step is None else int(step),
                layers=[[_num(v) or 0.0 for v in layer] for layer in load],
                routing_entropy=[_num(v) or 0.0 for v in ent] if isinstance(ent, list) else None,
            )
            values = sum(len(layer) for layer in self.expert_load.layers)
            values += len(self.expert_load.routing_entropy or [])
            self.nbytes += (_SLOT + _FLOAT) * values - self._load_bytes  # it replaces the previous one
            self._load_bytes = (_SLOT + _FLOAT) * values


def _domains(domains: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    return {
        str(d): {k: _num(v) for k, v in vals.items()} for d, vals in domains.items() if isinstance(vals, dict)
    }


class MetricsReader:
    """Columns of metrics files, kept least recently used first out within `max_bytes` (default:
    `cache_bytes()`) by marin/dashboard/lru.py's cache, each counted by its `nbytes`."""

    def __init__(self, store: PrefixStore, max_bytes: int | None = None):
        self.store = store
        self._files: ByteLru[str, _Columns] = ByteLru(cache_bytes() if max_bytes is None else max_bytes,
                                                      lambda cols: cols.nbytes)
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._files.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._files.max_bytes = value

    @property
    def cached_bytes(self) -> int:
        return self._files.bytes

    def cached_files(self) -> list[str]:
        """The files whose columns are kept, least recently used first."""
        return self._files.cached()

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
                    rows, _ = parse_jsonl(data[:end])  # a cut or binary line is skipped, like a torn one
                    for row in rows:
                        cols.add(row)
                    cols.consumed += end
                cols.signature = signature(info)
            self._files.put(rel, cols)  # counted again: it may have grown
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
