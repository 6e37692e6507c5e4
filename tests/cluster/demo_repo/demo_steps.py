"""Step functions of the submit tests' experiment; lives next to the script, installed nowhere."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from marin import runtime_field

VERSION = "original"


@dataclasses.dataclass(frozen=True)
class MarkConfig:
    output_path: str
    counter_dir: str = runtime_field()
    """Where each call is counted: the test's side channel, not an input (a runtime field, so the calls
    written there are not fingerprinted as a raw input that changed)."""
    gate: str = runtime_field(default="")
    """A file the step waits for (the test's side channel, like counter_dir)."""
    after: str = ""


def mark(cfg: MarkConfig) -> None:
    """Count the call, say hello, wait for the gate file (if any), write the module's VERSION."""
    name = os.path.basename(cfg.output_path.rstrip("/"))
    with open(Path(cfg.counter_dir) / f"{name.rsplit('-', 1)[0]}.calls", "a") as f:
        f.write(f"{os.getpid()}\n")
    print(f"step {name} says hello", flush=True)
    deadline = time.time() + 600
    while cfg.gate and not Path(cfg.gate).exists() and time.time() < deadline:
        print(f"step {name} waiting at {time.time():.3f}", flush=True)
        time.sleep(0.2)
    Path(cfg.output_path).mkdir(parents=True, exist_ok=True)
    Path(cfg.output_path, "version.txt").write_text(VERSION)
