"""The dashboard's results cache (marin/dashboard/results.py) is bounded by bytes, least recently used out
first, like the metrics cache (review of issue 33: it never shrank)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin.dashboard import results
from marin.dashboard.context import Dashboard


def _ids(dash: Dashboard) -> list[str]:
    return [s.id for s in dash.experiments.query(limit=1000).items]


def test_the_results_cache_keeps_the_most_recently_used_within_its_budget(
    synthetic_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dash = Dashboard.open(str(synthetic_prefix), cache_ttl=0)
    ids = _ids(dash)
    assert len(ids) == 12
    unbounded = results._Lru(1 << 40)
    monkeypatch.setattr(results, "_CACHE", unbounded)
    full = {i: results.numbers(dash, i) for i in ids}
    cost = unbounded.bytes // len(ids)
    assert cost >= results._ENTRY and [k[1] for k in unbounded.cached()] == ids

    bounded = results._Lru(int(4.5 * cost))  # room for four experiments' numbers
    monkeypatch.setattr(results, "_CACHE", bounded)
    for i in ids[:4]:
        results.numbers(dash, i)
    results.numbers(dash, ids[0])  # used again: now the most recent
    results.numbers(dash, ids[4])  # the least recently used (ids[1]) leaves
    assert [k[1] for k in bounded.cached()] == [ids[2], ids[3], ids[0], ids[4]]
    assert 0 < bounded.bytes <= bounded.max_bytes
    for i in ids:  # every experiment still gets its numbers, recomputed when evicted
        assert results.numbers(dash, i) == full[i]
    assert len(bounded.cached()) == 4 and bounded.bytes <= bounded.max_bytes


def test_an_entry_over_the_budget_is_not_kept_and_evicts_nothing(
    synthetic_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dash = Dashboard.open(str(synthetic_prefix), cache_ttl=0)
    ids = _ids(dash)
    lru = results._Lru(1 << 40)
    monkeypatch.setattr(results, "_CACHE", lru)
    for i in ids[:2]:
        results.numbers(dash, i)
    lru.max_bytes = lru.bytes + 10  # nothing as large as an experiment's numbers fits any more
    kept, held = lru.cached(), lru.bytes
    big = results._Numbers("worked", [], [], "x" * (lru.max_bytes + 1))
    lru.put((id(dash), "too-big"), (None, None, big, 0.0))
    assert lru.cached() == kept and lru.bytes == held


def test_a_running_experiments_numbers_are_reused_within_the_stores_ttl_only(
    synthetic_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a run is RUNNING its steps may write results at any moment, so its numbers are recomputed once
    the store's ttl has passed (before: on every request, a list page paying for each running experiment);
    a finished experiment's stay cached while its manifest and verdicts are unchanged."""
    dash = Dashboard.open(str(synthetic_prefix), cache_ttl=60)
    items = dash.experiments.query(limit=1000).items
    running = next(s.id for s in items if s.state == "RUNNING")
    done = next(s.id for s in items if s.state == "SUCCESS")
    monkeypatch.setattr(results, "_CACHE", results._Lru(1 << 40))
    computed: list[str] = []
    real = results._compute

    def counting(d: Dashboard, experiment_id: str) -> results._Numbers:
        computed.append(experiment_id)
        return real(d, experiment_id)

    monkeypatch.setattr(results, "_compute", counting)
    first = [results.numbers(dash, i) for i in (running, done)]
    assert [results.numbers(dash, i) for i in (running, done)] == first and computed == [running, done]
    dash.store.ttl = 0  # the ttl has passed: the running one is computed again, the finished one is not
    assert [results.numbers(dash, i) for i in (running, done)] == first
    assert computed == [running, done, running]


def test_prewarm_computes_the_newest_first_so_the_first_list_pages_are_served_from_the_cache(
    synthetic_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dash = Dashboard.open(str(synthetic_prefix), cache_ttl=60)
    ids = _ids(dash)
    lru = results._Lru(1 << 40)
    monkeypatch.setattr(results, "_CACHE", lru)
    assert results.prewarm(dash, 0.0) == (0, len(ids)) and lru.cached() == []
    assert results.prewarm(dash, 60.0) == (len(ids), len(ids))
    assert [k[1] for k in lru.cached()] == ids  # newest first, as the list shows them

    def compute(*_: object) -> None:
        raise AssertionError("a prewarmed experiment was computed again")

    monkeypatch.setattr(results, "_compute", compute)
    for i in ids:
        assert results.numbers(dash, i) is lru.get((id(dash), i))[2]
