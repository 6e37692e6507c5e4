"""Shared fixtures: one embedded Ray per test session, temporary prefixes, and real executor runs.

- `ray_embedded`: starts embedded Ray once per session (no dashboard, bounded object store). Run Ray tests
  inside `scripts/netns`.
- `marin_prefix`: a fresh local prefix (an absolute path string).
- `run_marin(steps, **kw)`: runs steps with `marin.run_experiment` on the local backend under `marin_prefix`.
- `mixed_run`: a real run left in every state at once (SUCCESS, FAILED, DEP_FAILED and a RUNNING step that
  finishes when `mixed_run.release()` is called), for the dashboard and tracker tests.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_embedded() -> Iterator[Any]:
    import ray

    from marin.execution.ray_backend import ensure_ray

    started = ensure_ray(None)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def marin_prefix(tmp_path: Path) -> str:
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    return str(prefix)


@pytest.fixture
def run_marin(marin_prefix: str) -> Callable[..., Any]:
    from marin import ExecutorMainConfig, run_experiment

    flags = {f.name for f in dataclasses.fields(ExecutorMainConfig)}

    def run(steps: list[Any], **kw: Any) -> Any:
        """`kw`: ExecutorMainConfig's fields (prefix and backend default to `marin_prefix` and local) and
        run_experiment's own keyword arguments."""
        config = ExecutorMainConfig(**{"prefix": marin_prefix, "backend": "local",
                                       **{k: kw.pop(k) for k in list(kw) if k in flags}})
        kw.setdefault("verbose", False)
        kw.setdefault("script", "tests/experiment_under_test.py")
        return run_experiment(steps, config, **kw)

    return run


@dataclasses.dataclass
class MixedRun:
    """A run in progress: `prefix`, `experiment_id` (once known), the step names by state, `release()`."""

    prefix: str
    names: dict[str, str]
    release_file: str
    started_file: str
    thread: threading.Thread
    result: dict[str, Any]

    def release(self, timeout: float = 60.0) -> Any:
        Path(self.release_file).write_text("go\n")
        self.thread.join(timeout)
        return self.result.get("result")


@pytest.fixture
def mixed_run(marin_prefix: str, tmp_path: Path) -> Iterator[MixedRun]:
    from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
    from tests.marin.fns import (
        BlockConfig,
        FailConfig,
        NoopConfig,
        WriteConfig,
        block_until_released,
        fail,
        noop,
        write_numbers,
    )

    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    ok = Step(name="mixed/ok", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=3))
    bad = Step(name="mixed/bad", fn=fail,
               config=FailConfig(output_path=this_output_path(), message="planned failure"))
    child = Step(name="mixed/child", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                                 inputs=(output_path_of(bad),)))
    slow = Step(name="mixed/slow", fn=block_until_released, config=BlockConfig(
        output_path=this_output_path(), started_file=started, release_file=release))
    out: dict[str, Any] = {}

    def target() -> None:
        out["result"] = run_experiment([ok, child, slow],
                                       ExecutorMainConfig(prefix=marin_prefix, backend="local",
                                                          issue="openlab/demo#7", max_concurrent=4),
                                       verbose=False, description="every state at once",
                                       script="experiments/exp7_mixed.py")

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.time() + 60
    wanted = {"mixed/ok": "SUCCESS", "mixed/bad": "FAILED", "mixed/child": "DEP_FAILED",
              "mixed/slow": "RUNNING"}

    def states() -> dict[str, str]:
        found = {}
        for path in Path(marin_prefix).rglob(".marin/status.json"):
            try:
                data = json.loads(path.read_text())
            except ValueError:  # replaced while we read it
                continue
            found[data["name"]] = data["status"]
        return found

    while states() != wanted:  # every state recorded: the fixture's promise
        if time.time() > deadline:
            raise TimeoutError(f"the mixed run did not reach {wanted}: {states()}")
        time.sleep(0.02)
    run = MixedRun(marin_prefix, {"SUCCESS": "mixed/ok", "FAILED": "mixed/bad", "DEP_FAILED": "mixed/child",
                                  "RUNNING": "mixed/slow"}, release, started, thread, out)
    yield run
    Path(release).write_text("go\n")
    thread.join(60)
