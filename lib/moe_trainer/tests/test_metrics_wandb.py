"""W&B resume after a killed attempt, with a real wandb-core service shared the way W&B shares it: a parent
process that used W&B exports ``WANDB_SERVICE``, so trainer processes it starts join to the parent's service.
A SIGKILLed attempt leaves its run's stream open in that service forever; the resumed attempt must still get
its run (same id, same history file), not "run ID ... is in use"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ATTEMPT = textwrap.dedent("""
    import os, signal, sys
    from moe_trainer.metrics import MetricsConfig, MetricsWriter
    out, start, die = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "die"
    w = MetricsWriter(out, MetricsConfig(wandb_mode="offline", progress_bar=False), run_config={"a": 1},
                      total_steps=4, start_step=start)
    for step in range(start + 1, start + 3):
        w.log({"step": step, "loss": 1.0 / step})
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    w.close()
    print("service-after", os.environ.get("WANDB_SERVICE"))
""")


@pytest.fixture
def shared_service(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A wandb-core service owned by a parent process, exported through WANDB_SERVICE like W&B does."""
    code = textwrap.dedent("""
        import os, sys, time, wandb
        run = wandb.init(project="parent", mode="offline", dir=sys.argv[1],
                         settings=wandb.Settings(silent=True, console="off"))
        run.finish()
        print(os.environ["WANDB_SERVICE"], flush=True)
        sys.stdin.read()  # keep the service alive until the test closes stdin
    """)
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdin is not None
    token = parent.stdout.readline().strip()
    assert token, "the parent process did not start a wandb service"
    yield token
    parent.stdin.close()
    parent.wait(timeout=60)


def _attempt(out: Path, start: int, die: bool, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_SERVICE": token}
    return subprocess.run([sys.executable, "-c", ATTEMPT, str(out), str(start), "die" if die else "ok"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_an_attempt_killed_inside_a_shared_service_is_resumed_with_its_run_id(
        shared_service: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    killed = _attempt(out, 0, True, shared_service)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_id = json.loads((out / "wandb.json").read_text())["run_id"]

    resumed = _attempt(out, 2, False, shared_service)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "is still held by a dead attempt" in resumed.stderr
    assert f"service-after {shared_service}" not in resumed.stdout  # it resumed through a service of its own
    assert json.loads((out / "wandb.json").read_text())["run_id"] == run_id
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(run_id in name for name in runs), runs


def test_a_fresh_attempt_keeps_using_the_shared_service(shared_service: str, tmp_path: Path) -> None:
    done = _attempt(tmp_path / "run", 0, False, shared_service)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is still held" not in done.stderr
    assert f"service-after {shared_service}" in done.stdout
