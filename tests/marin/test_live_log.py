"""Live attempt logs on s3:// (moto on loopback): readable while the step runs, kept up to the last chunk when
the worker vanishes, exact across chunk boundaries and consolidations."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from marin.status import files as sf
from marin.status import live_log
from marin.status.live_log import LogShipper, read_log
from marin.storage.fs import storage_for
from tests.marin.fns import TalkConfig, talk_then_wait


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_a_reader_sees_each_shipped_chunk_and_the_final_log(s3_bucket: str, tmp_path: Path) -> None:
    local, log = tmp_path / "attempt.log", f"{s3_bucket}/live/a/.marin/logs/attempt-1.log"
    local.write_text("")
    storage = storage_for(log)
    shipper = LogShipper(storage, str(local), log, interval_s=3600)
    shipper._write_state({"generation": 0, "base_bytes": 0})  # started without its thread: ship by hand
    assert read_log(storage, log) == ""
    _append(local, "step 1 loss 4.2\n")
    shipper.ship()
    assert read_log(storage, log) == "step 1 loss 4.2\n"
    _append(local, "step 2 loss 3.9\nhalf a li")
    shipper.ship()
    assert read_log(storage, log) == "step 1 loss 4.2\nstep 2 loss 3.9\nhalf a li"
    _append(local, "ne\n")
    shipper.finish()
    assert read_log(storage, log) == "step 1 loss 4.2\nstep 2 loss 3.9\nhalf a line\n"
    assert storage.read_text(log) == "step 1 loss 4.2\nstep 2 loss 3.9\nhalf a line\n"


def test_consolidation_keeps_the_text_exact_and_the_listing_short(
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live_log, "CHUNKS_PER_GENERATION", 4)
    local, log = tmp_path / "attempt.log", f"{s3_bucket}/live/b/.marin/logs/attempt-1.log"
    local.write_text("")
    storage = storage_for(log)
    shipper = LogShipper(storage, str(local), log, interval_s=3600)
    shipper._write_state({"generation": 0, "base_bytes": 0})
    done = ""
    for i in range(11):
        line = f"line {i} é€😀\n"  # multi-byte characters
        data = line.encode()
        # the first part ends inside the 4-byte emoji: the shipper must hold those bytes back until complete
        with open(local, "ab") as f:
            f.write(data[:-3])
        shipper.ship()
        assert read_log(storage, log) == done + line[:-2]
        with open(local, "ab") as f:
            f.write(data[-3:])
        shipper.ship()
        done += line
        assert read_log(storage, log) == done
    assert shipper.generation == 5  # 22 chunks at 4 per generation
    assert len(storage.listdir(f"{log}.live/g{shipper.generation:06d}") or []) <= 4


def test_the_background_thread_ships_within_its_interval(s3_bucket: str, tmp_path: Path) -> None:
    local, log = tmp_path / "attempt.log", f"{s3_bucket}/live/c/.marin/logs/attempt-1.log"
    local.write_text("")
    storage = storage_for(log)
    shipper = LogShipper(storage, str(local), log, interval_s=0.2).start()
    try:
        _append(local, "hello from a running step\n")
        deadline = time.time() + 60
        while read_log(storage, log) != "hello from a running step\n":
            assert time.time() < deadline, read_log(storage, log)
            time.sleep(0.1)
    finally:
        shipper.finish()


SHIP_THEN_DIE = """
import os, signal, sys, time
from marin.status.live_log import LogShipper
from marin.storage.fs import storage_for
from tests.marin.fns import TalkConfig, talk_then_wait
local, log = sys.argv[1], sys.argv[2]
open(local, "w").close()
shipper = LogShipper(storage_for(log), local, log, interval_s=0.1).start()
with open(local, "a") as f:
    for i in range(5):
        f.write(f"line {i}\\n"); f.flush()
while shipper.shipped < 35:
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_worker_leaves_its_log_up_to_the_last_chunk(s3_bucket: str, tmp_path: Path) -> None:
    local, log = tmp_path / "attempt.log", f"{s3_bucket}/live/d/.marin/logs/attempt-1.log"
    proc = subprocess.run(
        [sys.executable, "-c", SHIP_THEN_DIE, str(local), log], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr
    assert read_log(storage_for(log), log) == "".join(f"line {i}\n" for i in range(5))


def _run_in_thread(step: Step, prefix: str) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def go() -> None:
        out["result"] = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"),
                                       verbose=False, script="live.py")

    thread = threading.Thread(target=go)
    thread.start()
    return thread, out


def test_a_running_steps_log_on_s3_shows_its_lines_while_it_runs(s3_bucket: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    step = Step(
        name="live/talk", fn=talk_then_wait, config=TalkConfig(output_path=this_output_path(), gate=str(gate))
    )
    prefix = f"{s3_bucket}/runs/live-{time.time_ns()}"
    thread, out = _run_in_thread(step, prefix)
    storage = storage_for(prefix)
    log = None
    deadline = time.time() + 120
    while time.time() < deadline:
        found = storage.listdir(f"{prefix}/live") or []
        if found:
            log = sf.log_path(f"{prefix}/live/{found[0]}", 1)
            if "talking 2" in (read_log(storage, log) or ""):
                break
        time.sleep(0.2)
    assert log is not None and read_log(storage, log) == "talking 0\ntalking 1\ntalking 2\n"
    from fastapi.testclient import TestClient

    from marin.dashboard import create_app

    with TestClient(create_app(prefix, cache_ttl=0)) as client:  # the dashboard's log tail reads it live too
        step_path = log.removeprefix(prefix + "/").split("/.marin/")[0]
        tail = client.get(f"/api/logs/{step_path}").json()
    assert tail["text"] == "talking 0\ntalking 1\ntalking 2\n" and tail["attempt"] == 1, (tail, step_path)
    from marin.cluster.jobs_cli import StepLogFollower

    [manifest] = storage.listdir(f"{prefix}/experiments") or []
    seen: list[str] = []
    StepLogFollower(prefix, manifest.removesuffix(".json"), seen.append).poll()  # marin jobs logs --steps
    assert "".join(seen) == "".join(f"[live/talk] talking {i}\n" for i in range(3))
    assert thread.is_alive()  # the step is still running: the lines were read live
    gate.write_text("go")
    thread.join(120)
    assert out["result"].status == "SUCCESS"  # type: ignore[attr-defined]
    final = storage.read_text(log) or ""  # the final, whole log
    assert final.startswith("talking 0\ntalking 1\ntalking 2\nwrote s3://")
    assert read_log(storage, log) == final


def test_a_worker_killed_mid_step_leaves_its_log_up_to_the_last_chunk(s3_bucket: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("die")
    # max_preemptions=0: a killed worker is an interruption, else re-run (and killed again) up to 100 times
    step = Step(
        name="live/die",
        fn=talk_then_wait,
        max_preemptions=0,
        config=TalkConfig(output_path=this_output_path(), gate=str(gate)),
    )
    prefix = f"{s3_bucket}/runs/dead-{time.time_ns()}"
    thread, out = _run_in_thread(step, prefix)
    thread.join(180)
    result = out["result"]
    assert result.status == "FAILED"  # type: ignore[attr-defined]
    storage = storage_for(prefix)
    [name] = storage.listdir(f"{prefix}/live") or []
    log = sf.log_path(f"{prefix}/live/{name}", 1)
    assert storage.read_text(log) is None  # never finished: only the shipped chunks exist
    assert read_log(storage, log) == "talking 0\ntalking 1\ntalking 2\n"
