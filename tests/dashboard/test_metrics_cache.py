"""The dashboard's parsed-metrics cache is bounded by bytes, least recently used out first (issue 32: it grew
by about 130 MB per 100 MB metrics file read and never shrank)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from marin.dashboard.metrics import CACHE_ENV_VAR, DEFAULT_CACHE_BYTES, MetricsReader, cache_bytes
from marin.dashboard.store import PrefixStore


def _write_metrics(prefix: Path, name: str, rows: int) -> str:
    step = prefix / "train" / name
    step.mkdir(parents=True)
    with open(step / "metrics.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"step": i, "loss": 3.0 - i * 1e-4, "lr": 1e-3, "grad_norm": 0.5 + i * 1e-6,
                                "tokens_per_s": 1000.0 + i}) + "\n")
    return f"train/{name}"


def test_eviction_is_by_bytes_least_recently_used_first(tmp_path: Path) -> None:
    small = [_write_metrics(tmp_path, f"small{i}", 100) for i in range(3)]
    big = _write_metrics(tmp_path, "big", 1000)
    unbounded = MetricsReader(PrefixStore(str(tmp_path), ttl=0), max_bytes=1 << 40)
    cost = {}
    for rel in [*small, big]:
        assert unbounded.metrics(rel, max_points=10) is not None
        cost[rel] = unbounded.cached_bytes - sum(cost.values())
    assert cost[big] > 9 * cost[small[0]] and cost[small[0]] == cost[small[1]] == cost[small[2]] > 0

    # room for the big file and one small one, or all three small ones, not more
    reader = MetricsReader(PrefixStore(str(tmp_path), ttl=0), max_bytes=cost[big] + cost[small[0]])
    for rel in small:
        reader.metrics(rel, max_points=10)
    assert reader.cached_files() == [f"{rel}/metrics.jsonl" for rel in small]
    reader.metrics(small[0], max_points=10)  # used again: now the most recent
    reader.metrics(big, max_points=10)  # needs the room of two small files: the two least recently used go
    assert reader.cached_files() == [f"{small[0]}/metrics.jsonl", f"{big}/metrics.jsonl"]
    assert reader.cached_bytes == cost[big] + cost[small[0]] <= reader.max_bytes
    again = reader.metrics(small[1], max_points=10)  # evicted, so parsed again from the file, complete
    assert again is not None and again.rows == 100 and again.series["tokens_per_s"][-1] == 1099.0
    assert reader.cached_files() == [f"{big}/metrics.jsonl", f"{small[1]}/metrics.jsonl"]


def test_a_file_over_the_budget_is_served_but_not_kept(tmp_path: Path) -> None:
    rel = _write_metrics(tmp_path, "huge", 500)
    reader = MetricsReader(PrefixStore(str(tmp_path), ttl=0), max_bytes=1000)
    metrics = reader.metrics(rel, max_points=50)
    assert metrics is not None and metrics.rows == 500 and metrics.downsampled
    assert reader.cached_files() == [] and reader.cached_bytes == 0


def test_the_counted_bytes_are_the_memory_the_columns_take(tmp_path: Path) -> None:
    rel = _write_metrics(tmp_path, "measured", 20_000)
    reader = MetricsReader(PrefixStore(str(tmp_path), ttl=0), max_bytes=1 << 40)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader.metrics(rel, max_points=10)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 * held <= reader.cached_bytes <= 1.25 * held, (reader.cached_bytes, held)


def test_the_budget_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV_VAR, raising=False)
    assert cache_bytes() == DEFAULT_CACHE_BYTES == 256 << 20
    monkeypatch.setenv(CACHE_ENV_VAR, "64")
    assert cache_bytes() == 64 << 20 and cache_bytes(0.5) == 1 << 19 and cache_bytes(0) == 0
    monkeypatch.setenv(CACHE_ENV_VAR, "lots")
    with pytest.raises(ValueError, match=f"{CACHE_ENV_VAR}='lots' is not a size in MiB"):
        cache_bytes()
    with pytest.raises(ValueError, match="--metrics-cache-mb='-1' is not a size in MiB"):
        cache_bytes(-1)


def test_the_cli_refuses_a_bad_budget(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "marin", "dashboard", "--prefix", str(tmp_path),
                           "--metrics-cache-mb", "-3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--metrics-cache-mb='-3.0' is not a size in MiB" in done.stderr


def test_a_torn_or_binary_line_is_skipped_and_the_cached_columns_stay_true(tmp_path: Path) -> None:
    run = tmp_path / "train" / "x-1"
    run.mkdir(parents=True)
    path = run / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    reader = MetricsReader(PrefixStore(str(tmp_path)))
    assert reader.metrics("train/x-1", 100).steps == [1]
    with path.open("ab") as f:  # a writer killed mid-line, then resumed; and a binary line
        f.write(json.dumps({"step": 2, "loss": 2.0}).encode() + b"\n" + b'{"step": 3, "lo\n' + b"\xff\xfe\n")
        f.write(json.dumps({"step": 4, "loss": 1.0}).encode() + b"\n")
    for _ in range(2):  # each request answers, and never adds a row twice
        assert reader.metrics("train/x-1", 100).steps == [1, 2, 4]


def test_a_file_over_the_budget_evicts_nothing(tmp_path: Path) -> None:
    """Serving a file larger than the whole budget keeps the files already cached (before: it was inserted,
    pushed every other file out, then was dropped itself)."""
    small = [_write_metrics(tmp_path, f"kept{i}", 50) for i in range(2)]
    huge = _write_metrics(tmp_path, "huge", 2000)
    reader = MetricsReader(PrefixStore(str(tmp_path), ttl=0), max_bytes=1 << 40)
    for rel in small:
        reader.metrics(rel, max_points=10)
    reader.max_bytes = reader.cached_bytes + 1000  # room for the two small files, far less than the huge one
    kept = reader.cached_files()
    metrics = reader.metrics(huge, max_points=10)
    assert metrics is not None and metrics.rows == 2000
    assert reader.cached_files() == kept == [f"{rel}/metrics.jsonl" for rel in small]
    assert 0 < reader.cached_bytes <= reader.max_bytes
