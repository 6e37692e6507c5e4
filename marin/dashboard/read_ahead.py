"""An experiment page's storage reads at once, not one after another.

On an object store every look at the store is a round trip (tens of milliseconds), and a later load of an
experiment page (past the cache's `ttl`) makes three that do not depend on each other: the experiments/
listing (is the manifest still the one read?), the listing of the steps' parent with the status.json files
that changed (`experiments.StepViews.read_statuses`), and the experiment's verdicts.json (`results.numbers`).
The page code asks for them in that order, each waiting for the one before. `read_ahead` makes the three at
the same time, from the manifest as last read, before the page runs; inside `PrefixStore.one_request` the page
then finds each answer as fresh as the request and does not ask again.

Nothing is trusted longer than before: every read here is made by this request. A manifest that changed since
it was last read only makes the read-ahead partly useless (the page reads the steps it did not cover itself);
a read that fails here is made again by the page, which reports it (the path and the fix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from marin.dashboard.context import Dashboard
from marin.status.manifest import EXPERIMENTS_DIR


def verdicts_rel(experiment_id: str) -> str:
    """Where an experiment's verdicts.json lies, relative to the prefix."""
    return f"{EXPERIMENTS_DIR}/{experiment_id}/verdicts.json"


def read_ahead(dash: Dashboard, experiment_id: str) -> int:
    """Make the storage reads of an experiment page's later load at once (see the module docstring), on an
    object store and when the experiment's manifest was read before; returns how many ran (0 or 3)."""
    store = dash.store
    known = None if store.is_local else dash.experiments.known(experiment_id)
    if known is None:
        return 0
    jobs: list[Callable[[], Any]] = [
        dash.experiments.refresh,
        lambda: store.read_json_fetched(verdicts_rel(experiment_id)),
        lambda: dash.experiments.step_views.read_statuses(experiment_id, known),
    ]
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="marin-read-ahead") as pool:
        futures = [pool.submit(job) for job in jobs]
        for future in futures:
            # a read that failed here is made again by the page, which reports it (the path and the fix)
            with contextlib.suppress(Exception):
                future.result()
    return len(jobs)
