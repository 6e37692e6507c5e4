"""marin.compare's `Source` over the dashboard's cached readers: the store's signature cache for JSON
records, the incremental metrics.jsonl reader for columns, and the experiment index for manifests and for
which experiments name a step (so a comparison or a headline costs no listing and no re-parse)."""

from __future__ import annotations

from typing import Any

from marin.compare.source import Columns
from marin.dashboard.experiments import ExperimentIndex
from marin.dashboard.metrics import MetricsReader
from marin.dashboard.store import PrefixStore


class DashboardSource:
    """`known`: records just read in a batch (`PrefixStore.read_json_many`), served as read; a record that
    could not be read there is read again (and its error raised) by `read_json`."""

    def __init__(self, store: PrefixStore, metrics: MetricsReader, index: ExperimentIndex,
                 known: dict[str, Any] | None = None) -> None:
        self.prefix = store.prefix
        self.store, self.metrics, self.index = store, metrics, index
        self.known = known or {}

    def read_json(self, rel: str) -> Any:
        if rel in self.known and not isinstance(self.known[rel], Exception):
            return self.known[rel]
        return self.store.read_json(rel)

    def columns(self, rel: str) -> Columns | None:
        return self.metrics.columns(rel)

    def manifests(self) -> dict[str, dict[str, Any]]:
        return self.index.manifest_map()

    def relative(self, output_path: str) -> str | None:
        return self.store.relative(output_path)

    def owners(self) -> dict[str, str]:
        return self.index.owners()

    def containing(self, step_hash: str) -> list[str]:
        return self.index.containing(step_hash)
