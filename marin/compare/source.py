"""Where the comparison reads from: a `Source` is a read-only view of one prefix (manifests, JSON records,
metrics.jsonl columns). `PrefixSource` reads a prefix through fsspec for the CLI and notebooks; the dashboard
passes its own cached store (marin/dashboard/compare_source.py), so both read the same files the same way.

`Columns` is metrics.jsonl parsed into columns: `steps` (the `step` of every training row) and `series`
(every numeric top-level key of those rows, `None` where a row lacks it). Rows without `loss` and `lr` (eval
rows, alert rows) are not training rows and are skipped; non-finite values (written as "nan"/"inf") read as
None.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import fsspec

from marin.errors import CorruptFileError
from marin.jsonio import parse_json


def number(value: Any) -> float | None:
    """A finite float, or None (booleans, strings, NaN and infinities are not plotted)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Columns:
    """metrics.jsonl's training rows as columns (see the module docstring)."""

    steps: list[float | None] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        if "loss" not in row and "lr" not in row:
            return
        n = len(self.steps)
        self.steps.append(number(row.get("step")))
        for key, value in row.items():
            v = number(value)
            if v is None or key == "step":
                continue
            col = self.series.get(key)
            if col is None:
                col = self.series[key] = [None] * n
            col.append(v)
        for col in self.series.values():
            if len(col) == n:
                col.append(None)


def parse_columns(lines: Iterable[bytes], where: str) -> Columns:
    cols = Columns()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line (still being appended)
        if not isinstance(row, dict):
            raise CorruptFileError(f"{where}: line {n + 1} is not a JSON object")
        cols.add(row)
    return cols


class Source(Protocol):
    """What the comparison needs from a prefix. Paths are relative to the prefix."""

    prefix: str

    def read_json(self, rel: str) -> Any:
        """Parsed JSON at `rel`, None when absent."""
        ...

    def columns(self, rel: str) -> Columns | None:
        """metrics.jsonl at `rel` as columns, None when absent."""
        ...

    def manifests(self) -> dict[str, dict[str, Any]]:
        """Every readable experiment manifest, by experiment id."""
        ...

    def relative(self, output_path: str) -> str | None:
        """`output_path` relative to the prefix, None when it is elsewhere."""
        ...


class PrefixSource:
    """A prefix read through fsspec, each file once (a CLI call or a notebook cell)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.prefix)
        self.root = root.rstrip("/")
        self._json: dict[str, Any] = {}
        self._manifests: dict[str, dict[str, Any]] | None = None

    def _full(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def read_json(self, rel: str) -> Any:
        if rel not in self._json:
            try:
                data = self.fs.cat_file(self._full(rel))
            except FileNotFoundError:
                self._json[rel] = None
            else:
                self._json[rel] = parse_json(data, self._full(rel))
        return self._json[rel]

    def columns(self, rel: str) -> Columns | None:
        try:
            data = self.fs.cat_file(self._full(rel))
        except FileNotFoundError:
            return None
        return parse_columns(data.split(b"\n"), self._full(rel))

    def manifests(self) -> dict[str, dict[str, Any]]:
        if self._manifests is None:
            try:
                names = self.fs.ls(self._full("experiments"), detail=False)
            except FileNotFoundError:
                names = []
            out = {}
            for name in sorted(str(n) for n in names):
                base = name.rstrip("/").rsplit("/", 1)[-1]
                if base.endswith(".json"):
                    doc = self.read_json(f"experiments/{base}")
                    if isinstance(doc, dict):
                        out[base[: -len(".json")]] = doc
            self._manifests = out
        return self._manifests

    def relative(self, output_path: str) -> str | None:
        path = output_path.split("://", 1)[-1] if "://" in output_path else output_path
        root = self.root.split("://", 1)[-1]
        if path.rstrip("/") == root:
            return ""
        return path[len(root) + 1:].rstrip("/") if path.startswith(root + "/") else None
