"""Importable step functions and configs shared by the engine's tests (workers import them by module path).

Files a test watches or uses to steer a step (counters, markers, gates) are runtime fields: they are side
channels, not inputs, so they never enter identity and are never fingerprinted as raw inputs."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from marin import runtime_field


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    output_path: str
    n: int = 10
    workers: int = runtime_field(default=1)


def write_numbers(cfg: WriteConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    print(f"writing {cfg.n} numbers")
    Path(cfg.output_path, "numbers.txt").write_text("\n".join(str(i) for i in range(cfg.n)) + "\n")


def write_with_outside_log(cfg: WriteConfig) -> None:
    """numbers.txt, and `logs/debug.log`: a link to a log outside the output path (a sibling file), as W&B
    links its core service's log."""
    write_numbers(cfg)
    outside = cfg.output_path + ".outside.log"
    Path(outside).write_text("started\n")
    os.makedirs(os.path.join(cfg.output_path, "logs"), exist_ok=True)
    os.symlink(outside, os.path.join(cfg.output_path, "logs", "debug.log"))


@dataclasses.dataclass(frozen=True)
class ShardsConfig:
    output_path: str
    files: int = 12


def write_shards(cfg: ShardsConfig) -> None:
    """`cfg.files` small files, `shard-00.txt`...: a step whose output manifest is too long to go inline."""
    os.makedirs(cfg.output_path, exist_ok=True)
    for i in range(cfg.files):
        Path(cfg.output_path, f"shard-{i:02d}.txt").write_text(f"shard {i}\n")


@dataclasses.dataclass(frozen=True)
class SumConfig:
    input_path: str
    output_path: str


def sum_numbers(cfg: SumConfig) -> None:
    total = sum(int(x) for x in Path(cfg.input_path).read_text().split())
    os.makedirs(cfg.output_path, exist_ok=True)
    Path(cfg.output_path, "total.txt").write_text(f"{total}\n")
    print(f"total={total}")


@dataclasses.dataclass(frozen=True)
class NoopConfig:
    output_path: str
    inputs: tuple[str, ...] = ()
    tag: str = ""


def noop(cfg: NoopConfig) -> None:
    """Does nothing: measures pure executor overhead."""


def ray_task_info(cfg: NoopConfig) -> None:
    """Records the Ray task this step ran as (its name) and the CPUs Ray assigned to it."""
    import ray

    context = ray.get_runtime_context()
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "task.json"), "w") as f:
        json.dump({"name": context.get_task_name(), "cpus": context.get_assigned_resources().get("CPU")}, f)


@dataclasses.dataclass(frozen=True)
class CountConfig:
    """Appends one line to `counter_file` per execution, so tests can count how often a step really ran."""

    output_path: str
    counter_file: str = runtime_field()
    sleep_s: float = 0.0
    inputs: tuple[str, ...] = ()
    tag: str = ""


def count_and_write(cfg: CountConfig) -> None:
    fd = os.open(cfg.counter_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{cfg.output_path}\n".encode())
    os.close(fd)
    time.sleep(cfg.sleep_s)
    os.makedirs(cfg.output_path, exist_ok=True)
    Path(cfg.output_path, "done.txt").write_text("ok\n")


@dataclasses.dataclass(frozen=True)
class FailConfig:
    output_path: str
    message: str = "boom"
    inputs: tuple[str, ...] = ()


def fail(cfg: FailConfig) -> None:
    print("about to fail")
    raise ValueError(cfg.message)


@dataclasses.dataclass(frozen=True)
class FlakyConfig:
    """Fails until `marker` exists; creates it on the first attempt (so the second attempt succeeds)."""

    output_path: str
    marker: str = runtime_field()


def flaky(cfg: FlakyConfig) -> None:
    if not os.path.exists(cfg.marker):
        Path(cfg.marker).write_text("seen\n")
        raise RuntimeError("first attempt fails")
    os.makedirs(cfg.output_path, exist_ok=True)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    output_path: str


def write_env(cfg: EnvConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    Path(cfg.output_path, "env.txt").write_text(os.environ.get("MARIN_TEST_VAR", "<unset>"))
    import socket

    Path(cfg.output_path, "node.txt").write_text(os.environ.get("MARIN_NODE_TAG", socket.gethostname()))


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """Writes `started_file`, then blocks until `release_file` exists (a step that stays RUNNING on
    demand)."""

    output_path: str
    started_file: str = runtime_field()
    release_file: str = runtime_field()
    timeout_s: float = 120.0


def block_until_released(cfg: BlockConfig) -> None:
    Path(cfg.started_file).write_text("started\n")
    deadline = time.time() + cfg.timeout_s
    while not os.path.exists(cfg.release_file):
        if time.time() > deadline:
            raise TimeoutError(f"{cfg.release_file} never appeared")
        time.sleep(0.02)
    os.makedirs(cfg.output_path, exist_ok=True)


@dataclasses.dataclass(frozen=True)
class FsWriteConfig:
    """Like WriteConfig, through fsspec, so the output path may be gs:// or s3://."""

    output_path: str
    text: str = "hello"


def fs_write(cfg: FsWriteConfig) -> None:
    import fsspec

    with fsspec.open(f"{cfg.output_path}/out.txt", "w") as f:
        f.write(cfg.text)
    print(f"wrote {cfg.output_path}/out.txt")


@dataclasses.dataclass(frozen=True)
class FsCopyConfig:
    input_path: str
    output_path: str


def fs_copy_upper(cfg: FsCopyConfig) -> None:
    import fsspec

    with fsspec.open(cfg.input_path, "r") as f:
        text = f.read()
    with fsspec.open(f"{cfg.output_path}/out.txt", "w") as f:
        f.write(text.upper())


@dataclasses.dataclass(frozen=True)
class DieConfig:
    """Ends the worker process itself: by a signal (`how="kill"`) or by `os._exit` (`how="exit"`)."""

    output_path: str
    how: str = "kill"


def die(cfg: DieConfig) -> None:
    import signal as _signal

    print("dying now", flush=True)
    if cfg.how == "kill":
        os.kill(os.getpid(), _signal.SIGKILL)
    os._exit(3)


@dataclasses.dataclass(frozen=True)
class ExclusiveConfig:
    """Marks itself running in `markers_dir` for `hold_s`; fails if another step's marker is there too
    (checked all along the hold, and the first to see the other says so to both: an overlap fails at once)."""

    output_path: str
    markers_dir: str = runtime_field()
    hold_s: float = 0.3


def exclusive(cfg: ExclusiveConfig) -> None:
    os.makedirs(cfg.markers_dir, exist_ok=True)
    mine = os.path.join(cfg.markers_dir, os.path.basename(cfg.output_path))
    seen = os.path.join(cfg.markers_dir, ".overlap")
    Path(mine).write_text("running\n")
    try:
        deadline = time.time() + cfg.hold_s
        while True:
            others = [n for n in os.listdir(cfg.markers_dir) if n not in (os.path.basename(mine), ".overlap")]
            if others or os.path.exists(seen):
                Path(seen).write_text("yes\n")
                raise RuntimeError(f"ran at the same time as {others or 'another step'}")
            if time.time() >= deadline:
                break
            time.sleep(0.02)
    finally:
        os.unlink(mine)
    os.makedirs(cfg.output_path, exist_ok=True)


@dataclasses.dataclass(frozen=True)
class RendezvousConfig:
    """Writes `arrive_file`, then waits for every file in `others` (so it only succeeds if they run at
    once)."""

    output_path: str
    arrive_file: str = runtime_field()
    others: tuple[str, ...]
    timeout_s: float = 60.0


def rendezvous(cfg: RendezvousConfig) -> None:
    Path(cfg.arrive_file).write_text("here\n")
    deadline = time.time() + cfg.timeout_s
    while not all(os.path.exists(p) for p in cfg.others):
        if time.time() > deadline:
            raise TimeoutError(f"the other steps never arrived: {cfg.others}")
        time.sleep(0.02)
    os.makedirs(cfg.output_path, exist_ok=True)


@dataclasses.dataclass(frozen=True)
class TalkConfig:
    output_path: str
    gate: str = runtime_field()
    """A local file: the step prints its lines, then waits for it (and writes out.txt), or dies if it says
    'die'."""
    lines: int = 3


def talk_then_wait(cfg: TalkConfig) -> None:
    """Print numbered lines, wait for the gate; on 'die', SIGKILL this worker once the lines were shipped."""
    import signal

    from marin.status import files as sf
    from marin.status.live_log import read_log
    from marin.storage.fs import storage_for

    for i in range(cfg.lines):
        print(f"talking {i}", flush=True)
    deadline = time.time() + 300
    while not os.path.exists(cfg.gate) and time.time() < deadline:
        time.sleep(0.1)
    if Path(cfg.gate).read_text().strip() == "die":
        log = sf.log_path(cfg.output_path, 1)
        while f"talking {cfg.lines - 1}" not in (read_log(storage_for(log), log) or ""):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    fs_write(FsWriteConfig(output_path=cfg.output_path, text="done"))
