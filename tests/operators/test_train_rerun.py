"""A re-run of a finished train step (`--force-run` of it, or a run after its status.json was damaged):
the engine keeps the earlier attempt's output files in `.marin/earlier-{N}/` before the new attempt writes,
the checkpoints stay in place so the trainer resumes at its end (no step redone), and the new
train_result.json reports the earlier attempt's throughput with a note, never 0 tokens/s (issue 32 item 3).
Real runs of the tiny trainer through the local backend, each in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.operators.test_train_eval import metrics_rows, write_cache

ROOT = Path(__file__).resolve().parents[2]
RUN = """
import dataclasses, json, sys
from pathlib import Path
from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from operators.train import train
from tests.operators.test_train_eval import small_train
prefix, train_cache, forced = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
trained = Step(name="rr/train", fn=train, config=dataclasses.replace(
    small_train(Path("unused"), train_cache), output_path=this_output_path()))
config = ExecutorMainConfig(prefix=prefix, backend="local", force_run=forced or None)
result = run_experiment([trained], config, verbose=False, script="tests/experiment_under_test.py")
print("RESULT " + json.dumps({"status": result.status, "path": result.output_path("rr/train")}))
"""


@pytest.fixture(scope="module")
def train_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    rng = np.random.default_rng(11)
    words = ["alpha", "beta", "gamma", "return", "def", "(x)", ":", "\n"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(20, 60)))) for _ in range(30)]
    return write_cache(str(tmp_path_factory.mktemp("rerun-cache")), "toy", texts, shards=2)


_COMPILE_CACHE: dict[str, str] = {}  # the module's persistent JAX compilation cache (set by compile_cache)


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One persistent JAX compilation cache for this module's runs: each test's first run trains the same
    step on the same shapes, and its re-runs load the same programs again."""
    _COMPILE_CACHE["dir"] = str(tmp_path_factory.mktemp("rerun-jax-cache"))
    yield
    _COMPILE_CACHE.clear()


def _run(prefix: Path, train_cache: str, forced: list[str]) -> tuple[dict[str, Any], str]:
    env = dict(os.environ)
    if "dir" in _COMPILE_CACHE:
        env.update({"JAX_COMPILATION_CACHE_DIR": _COMPILE_CACHE["dir"],
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    out = subprocess.run([sys.executable, "-c", RUN, str(prefix), train_cache, json.dumps(forced)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), out.stderr


def _first_run(prefix: Path, train_cache: str) -> tuple[Path, bytes, dict[str, Any], list[dict[str, Any]]]:
    first, _ = _run(prefix, train_cache, [])
    assert first["status"] == "SUCCESS"
    path = Path(first["path"])
    raw = (path / "train_result.json").read_bytes()
    result = json.loads(raw)
    assert result["steps_trained"] == 6 and result["start_step"] == 0 and result["tokens_per_s"] > 0
    assert "carried" not in result
    return path, raw, result, metrics_rows(path)


def _assert_rerun_kept_and_carried(path: Path, raw_1: bytes, result_1: dict[str, Any],
                                   rows_1: list[dict[str, Any]], kept: str) -> None:
    status = json.loads((path / ".marin/status.json").read_text())
    assert status["status"] == "SUCCESS" and status["attempt"] == 2
    assert (path / kept / "train_result.json").read_bytes() == raw_1  # the earlier result, byte for byte
    assert metrics_rows(path / kept) == rows_1
    assert metrics_rows(path) == rows_1  # resumed at its end: no step redone, no row added
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == ["4", "6"]  # left in place (2 kept)
    result = json.loads((path / "train_result.json").read_text())
    assert (result["step"], result["start_step"], result["steps_trained"]) == (6, 6, 0)
    assert result["loss"] == result_1["loss"]
    assert result["tokens_per_s"] == result_1["tokens_per_s"] > 0  # carried, never 0
    assert result["wall_s"] == result_1["wall_s"]
    assert result["carried"] == ("tokens_per_s and wall_s are the earlier attempt's (this attempt resumed "
                                 "at step 6, the end, and trained no step)")
    log_2 = (path / ".marin/logs/attempt-2.log").read_text()
    assert f"{result_1['tokens_per_s']:.0f} tokens/s" in log_2 and "trained no step" in log_2
    assert (path / ".marin/logs/attempt-1.log").exists()


def test_force_run_of_a_finished_train_step_keeps_its_result_and_reports_the_earlier_throughput(
        train_cache: str, tmp_path: Path) -> None:
    path, raw_1, result_1, rows_1 = _first_run(tmp_path / "prefix", train_cache)
    forced, err = _run(tmp_path / "prefix", train_cache, ["rr/train"])
    assert forced["status"] == "SUCCESS"
    assert (f"marin: step rr/train: runs again after attempt 1 succeeded; that attempt's output files are "
            f"kept in {path}/.marin/earlier-1") in err
    _assert_rerun_kept_and_carried(path, raw_1, result_1, rows_1, ".marin/earlier-1")

    # a third run: the second attempt's files get their own directory, the first's stay as they were
    third, _ = _run(tmp_path / "prefix", train_cache, ["rr/train"])
    assert third["status"] == "SUCCESS"
    assert (path / ".marin/earlier-1/train_result.json").read_bytes() == raw_1
    second = json.loads((path / ".marin/earlier-2/train_result.json").read_text())
    assert second["steps_trained"] == 0 and second["tokens_per_s"] == result_1["tokens_per_s"]


def test_a_train_step_whose_status_was_damaged_resumes_at_its_end_and_keeps_the_earlier_result(
        train_cache: str, tmp_path: Path) -> None:
    path, raw_1, result_1, rows_1 = _first_run(tmp_path / "prefix", train_cache)
    (path / ".marin/status.json").write_bytes(b'{"name": "rr/train", "hash": "ab')
    again, err = _run(tmp_path / "prefix", train_cache, [])
    assert again["status"] == "SUCCESS"
    assert f"the earlier outputs are kept in {path}/.marin/earlier-1" in err
    _assert_rerun_kept_and_carried(path, raw_1, result_1, rows_1, ".marin/earlier-1")


def test_without_an_earlier_result_a_run_resumed_at_its_end_reports_its_metrics_median(
        train_cache: str, tmp_path: Path) -> None:
    """The earlier train_result.json was deleted by hand: the figure is the median of metrics.jsonl's
    training rows (the first, which compiles, left out), said so in `carried`."""
    path, _, result_1, rows_1 = _first_run(tmp_path / "prefix", train_cache)
    (path / "train_result.json").unlink()
    forced, _ = _run(tmp_path / "prefix", train_cache, ["rr/train"])
    assert forced["status"] == "SUCCESS"
    result = json.loads((path / "train_result.json").read_text())
    assert result["steps_trained"] == 0
    assert result["tokens_per_s"] == pytest.approx(float(np.median([r["tokens_per_s"] for r in rows_1[1:]])))
    assert "median of metrics.jsonl's training rows" in result["carried"]
    assert not (path / ".marin/earlier-1/train_result.json").exists()
    assert metrics_rows(path / ".marin/earlier-1") == rows_1
