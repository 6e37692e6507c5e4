"""Numbers where people look: the verdict and headline metrics of the experiments list, and an experiment's
results (its own steps' final and eval metrics) and baseline, all from marin.compare (the same reading
`marin compare` and `marin status` do).

Cached per experiment, as the alert index is (marin/dashboard/alerts.py): an experiment's own steps only
write while a run of it is RUNNING, and a run's start and end rewrite its manifest. So what was computed is
reused while the manifest's signature is the same, no run of it is RUNNING (while one is, for the store's
`ttl` only, as long as the store trusts any file it read), and its verdicts.json is the same parsed object in
the store's cache (a person's verdict changes it); a list page of 25 experiments then
costs 25 cached reads instead of one per own step and record file.

Computing one experiment's numbers reads two or three small files per own step. So that the first visit of a
list page is not the one that pays for 25 experiments, `warm(dash)` computes them in one background thread,
newest experiments first (all of them on local storage, the newest `WARM_REMOTE` on an object store, where
each read is a request), whenever the experiment index changed; requests never wait for it.

The cache is bounded (`MAX_BYTES`, least recently used out first, each entry counted by `_cost`) by the
same implementation as the metrics cache (marin/dashboard/lru.py): a dashboard left running over a prefix
whose experiments come and go does not grow."""

from __future__ import annotations

import posixpath
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from marin.compare.headline import headline, own_values
from marin.compare.runs import baseline_of, own_steps
from marin.dashboard.compare_source import DashboardSource
from marin.dashboard.context import Dashboard
from marin.dashboard.lru import ByteLru
from marin.dashboard.read_ahead import verdicts_rel
from marin.dashboard.schemas import (
    ExperimentDetail,
    ExperimentSummary,
    HeadlineMetric,
    ResultValue,
    StepResult,
)
from marin.errors import CorruptFileError
from marin.status.manifest import EXPERIMENTS_DIR


def source(dash: Dashboard, known: dict[str, Any] | None = None) -> DashboardSource:
    return DashboardSource(dash.store, dash.metrics, dash.experiments, known)


@dataclass(frozen=True)
class _Numbers:
    verdict: str | None
    headline: list[HeadlineMetric]
    results: list[StepResult]
    baseline: str | None
    problem: str | None = None  # a record that cannot be read (verdicts.json, a result): the path and the fix


_ENTRY = 1024


def _cost(n: _Numbers) -> int:
    """What an entry is counted as: `_ENTRY` for the entry and its objects, `_VALUE` per number it holds, plus
    its strings (a proxy for its memory, of the same order; the budget is what bounds the cache, not an
    exact figure). Counted, not serialised: it is paid on every miss."""
    values = len(n.headline) + sum(len(r.values) for r in n.results)
    names = sum(len(m.name) for m in n.headline) + sum(len(r.path) + sum(len(v.metric) for v in r.values)
                                                        for r in n.results)
    return _ENTRY + _VALUE * values + names + sum(len(s or "") for s in (n.verdict, n.baseline, n.problem))


_VALUE = 120  # a small pydantic model holding a float, an optional float and a name


MAX_BYTES = 32 << 20
"""The cache's budget (a few KiB an experiment: some 10,000 experiments' numbers); least recently used out
first, so the experiments of a prefix that is no longer served, or were deleted, leave it."""
_Key = tuple[int, str]
_Entry = tuple[Any, Any, _Numbers, float]  # the manifest's signature, verdicts.json, the numbers, when


class _Lru(ByteLru[_Key, _Entry]):
    """The results cache: marin/dashboard/lru.py's cache, each entry counted by `_cost` of its numbers."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes, lambda entry: _cost(entry[2]))


_CACHE = _Lru(MAX_BYTES)
_LOCK = threading.Lock()


RESULT_FILES = ("train_result.json", "eval.json", "choices.json")
"""The records `marin.compare.table.step_metrics(curves=False)` reads in each own step's output path."""


def _prefetch(dash: Dashboard, experiment_id: str, owner: dict[str, str]) -> dict[str, Any]:
    """Every own step's result records, read in a few batched calls (`PrefixStore.read_json_many`: one listing
    of the parent holding the steps says which exist, one concurrent batch reads them) instead of probing
    three files per step one by one. A record that cannot be read is read again by the computation, which
    names it (the path and the fix)."""
    refs = own_steps(source(dash), experiment_id, owner)
    rels = [f"{ref.rel}/{name}" for ref in refs for name in RESULT_FILES]
    parents = [parent for ref in refs for parent in [posixpath.dirname(ref.rel)] * len(RESULT_FILES)]
    return dash.store.read_json_many(rels, parents)


def _compute(dash: Dashboard, experiment_id: str) -> _Numbers:
    owner = dash.experiments.owners()
    src = source(dash, _prefetch(dash, experiment_id, owner))
    step_values = own_values(src, experiment_id, owner)  # no metrics.jsonl: the step page has the curves
    h = headline(src, experiment_id, owner, step_values)
    results = []
    for ref, values in step_values:
        if values:
            # built from values already typed (marin.compare's): no validation to pay per value
            results.append(StepResult.model_construct(name=ref.name, path=ref.rel, values=[
                ResultValue.model_construct(metric=k, value=v.value, stderr=v.stderr)
                for k, v in values.items()]))
    metrics = [HeadlineMetric.model_construct(name=m.name, value=m.value, stderr=m.stderr) for m in h.metrics]
    return _Numbers(h.outcome, metrics, results, baseline_of(src, experiment_id, owner))


def numbers(dash: Dashboard, experiment_id: str) -> _Numbers:
    """An experiment's verdict, headline, results and baseline (cached: see the module docstring)."""
    found = dash.experiments.manifest(experiment_id)
    running = found is not None and any(
        isinstance(r, dict) and r.get("status") == "RUNNING" for r in found[0].get("runs") or [])
    sig = dash.experiments.signature_of(experiment_id)
    try:  # one GET on an object store, there or not (store.py `read_json_fetched`)
        verdicts = dash.store.read_json_fetched(verdicts_rel(experiment_id))
    except CorruptFileError as e:  # one problem row on the page, never a 500 (status/damaged.py)
        return _Numbers(None, [], [], None, problem=str(e))
    key = (id(dash), experiment_id)
    hit = _CACHE.get(key)
    now = time.monotonic()
    # A running experiment's steps may write a result at any moment: its numbers are reused only within the
    # store's ttl, the time for which the store itself trusts a file it read without a new stat.
    fresh = hit is not None and (not running or now - hit[3] < dash.store.ttl)
    if hit is not None and fresh and hit[0] == sig and hit[1] is verdicts:
        return hit[2]
    try:
        value = _compute(dash, experiment_id)
    except CorruptFileError as e:
        return _Numbers(None, [], [], None, problem=str(e))
    _CACHE.put(key, (sig, verdicts, value, now))
    return value


WARM_REMOTE = 100
_WARMING: set[int] = set()
_WARMED: dict[int, Any] = {}  # dashboard -> the manifest map it last warmed


def warm(dash: Dashboard) -> None:
    """Start computing every experiment's numbers in the background (see the module docstring), unless a
    warm-up of this dashboard is running or no manifest changed since the last one."""
    manifests = dash.experiments.manifest_map()
    with _LOCK:
        if id(dash) in _WARMING or _WARMED.get(id(dash)) is manifests:
            return
        _WARMING.add(id(dash))
        _WARMED[id(dash)] = manifests

    def run() -> None:
        try:
            for experiment_id in _to_warm(dash)[1]:
                numbers(dash, experiment_id)
        except (OSError, ValueError):
            pass  # a prefix gone or a corrupt record: the request that needs it computes it and reports why
        finally:
            with _LOCK:
                _WARMING.discard(id(dash))

    threading.Thread(target=run, name="marin-dashboard-warm", daemon=True).start()


def _to_warm(dash: Dashboard) -> tuple[list[str], list[str]]:
    """(every experiment, newest first; those a warm-up computes: all on local disk, the newest `WARM_REMOTE`
    on an object store, where each read is a request)."""
    ids = [s.id for s in dash.experiments.query(limit=1 << 30).items]
    return ids, ids if dash.store.is_local else ids[:WARM_REMOTE]


def prewarm(dash: Dashboard, budget_s: float) -> tuple[int, int]:
    """Compute the numbers of the newest experiments before the server listens, for at most `budget_s`
    seconds (then the background warm-up of the first list request does the rest): the first list pages a
    reader opens are then served from the cache, not computed while 8 requests and the warm-up thread share
    one interpreter (each computation makes some 75 system calls, and every one gives the lock away).
    Returns (experiments computed, experiments under the prefix)."""
    deadline = time.monotonic() + budget_s
    ids, todo = _to_warm(dash)
    done = 0
    try:
        for experiment_id in todo:
            if time.monotonic() >= deadline:
                break
            if done % 25 == 0:  # a list page's worth: its verdicts read in one batch
                read_verdicts(dash, todo[done:done + 25])
            numbers(dash, experiment_id)
            done += 1
    except Exception as e:  # noqa: BLE001 - never keeps the server from starting: the request reports it
        print(f"marin dashboard: computing the experiments' numbers before serving stopped: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
    return done, len(ids)


def read_verdicts(dash: Dashboard, experiment_ids: list[str]) -> None:
    """Bring the verdicts.json of a list page's experiments up to date in a few batched calls
    (`PrefixStore.read_json_many`), so that `numbers` of each finds it fresh rather than stating it alone.
    A file that cannot be read is read again by `numbers`, which names it."""
    rels = [f"{EXPERIMENTS_DIR}/{i}/verdicts.json" for i in experiment_ids]
    dash.store.read_json_many(rels, [EXPERIMENTS_DIR] * len(rels))


def with_headline(dash: Dashboard, summary: ExperimentSummary) -> ExperimentSummary:
    n = numbers(dash, summary.id)
    return summary.model_copy(update={"verdict": n.verdict, "headline": n.headline})


def with_results(dash: Dashboard, detail: ExperimentDetail) -> ExperimentDetail:
    """The detail with its verdict, headline, baseline and its own steps' results (eval and multiple-choice,
    and the final training loss of train_result.json; no metrics.jsonl is parsed for this page)."""
    n = numbers(dash, detail.id)
    problems = [*detail.problems, n.problem] if n.problem else detail.problems
    return detail.model_copy(update={"verdict": n.verdict, "headline": n.headline, "baseline": n.baseline,
                                     "results": n.results, "problems": problems})
