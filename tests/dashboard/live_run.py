"""A real experiment run for the browser test, started as its own process:

    python -m tests.dashboard.live_run PREFIX WORKDIR

Steps: train/tiny writes metrics.jsonl (the trainer's documented rows: loss, lr, norms, expert load, eval
rows) and wandb.json; eval/tiny writes eval.json; live/bad fails; live/child is DEP_FAILED; live/slow prints a
line every 0.1 s and stays RUNNING until WORKDIR/release exists. The functions are importable, as workers
need.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path


@dataclasses.dataclass(frozen=True)
class TinyTrainConfig:
    output_path: str
    steps: int = 80
    lr: float = 3e-3
    layers: int = 2
    experts: int = 4


def tiny_train(cfg: TinyTrainConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "metrics.jsonl"), "w") as f:
        for s in range(cfg.steps):
            load = [
                [(1 + math.cos(layer + e + s / 9)) / (2 * cfg.experts) for e in range(cfg.experts)]
                for layer in range(cfg.layers)
            ]
            row = {
                "step": s,
                "loss": 5 * math.exp(-s / 25) + 1.5,
                "lr": cfg.lr * min(1.0, (s + 1) / 10),
                "grad_norm": 2 * math.exp(-s / 40) + 0.1,
                "update_norm": cfg.lr * (1 + math.exp(-s / 30)),
                "skipped": False,
                "clipped": False,
                "tokens_per_s": 1000.0,
                "mfu": 0.01,
                "aux_loss": 0.01,
                "router_z_loss": 0.001,
                "logit_z_loss": 0.0,
                "drop_rate": 0.0,
                "expert_load": load,
                "routing_entropy": [1.3] * cfg.layers,
                "time": time.time(),
            }
            f.write(json.dumps(row) + "\n")
            if s and s % 20 == 0:
                domains = {
                    d: {
                        "loss": 3 - s / 100 - k / 10,
                        "bpb": 1.2 - s / 400 - k / 10,
                        "tokens": 100,
                        "bytes": 400,
                    }
                    for k, d in enumerate(("python", "prose"))
                }
                f.write(json.dumps({"step": s, "eval": {"domains": domains}}) + "\n")
            print(f"step {s} loss {row['loss']:.3f}")
    Path(cfg.output_path, "wandb.json").write_text(
        json.dumps(
            {"project": "openlab", "run_id": "tiny", "mode": "offline", "dir": cfg.output_path, "url": None}
        )
    )


@dataclasses.dataclass(frozen=True)
class TinyEvalConfig:
    output_path: str
    metrics_path: str


def tiny_eval(cfg: TinyEvalConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    assert os.path.exists(cfg.metrics_path)
    domains = {
        "python": {"loss": 2.1, "bpb": 0.8, "tokens": 1000, "bytes": 4000},
        "prose": {"loss": 2.6, "bpb": 1.0, "tokens": 1000, "bytes": 4200},
    }
    Path(cfg.output_path, "eval.json").write_text(
        json.dumps({"domains": domains, "micro": {"bpb": 0.9}, "macro": {"bpb": 0.9}})
    )


@dataclasses.dataclass(frozen=True)
class BadConfig:
    output_path: str


def bad(cfg: BadConfig) -> None:
    print("about to fail")
    raise ValueError("planned failure <b>not bold</b>")


@dataclasses.dataclass(frozen=True)
class ChildConfig:
    output_path: str
    input_path: str


def child(cfg: ChildConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)


@dataclasses.dataclass(frozen=True)
class SlowConfig:
    output_path: str
    started_file: str
    release_file: str


def slow(cfg: SlowConfig) -> None:
    Path(cfg.started_file).write_text("started\n")
    n = 0
    deadline = time.time() + 300
    while not os.path.exists(cfg.release_file) and time.time() < deadline:
        print(f"tick {n}", flush=True)
        n += 1
        time.sleep(0.1)
    os.makedirs(cfg.output_path, exist_ok=True)


def steps(workdir: str) -> list[Step]:
    train = Step(
        name="train/tiny",
        fn=tiny_train,
        config=TinyTrainConfig(output_path=this_output_path()),
        description="a tiny training run's metrics",
    )
    ev = Step(
        name="eval/tiny",
        fn=tiny_eval,
        config=TinyEvalConfig(
            output_path=this_output_path(), metrics_path=output_path_of(train, "metrics.jsonl")
        ),
    )
    failing = Step(name="live/bad", fn=bad, config=BadConfig(output_path=this_output_path()))
    dependent = Step(
        name="live/child",
        fn=child,
        config=ChildConfig(output_path=this_output_path(), input_path=output_path_of(failing)),
    )
    blocked = Step(
        name="live/slow",
        fn=slow,
        config=SlowConfig(
            output_path=this_output_path(),
            started_file=os.path.join(workdir, "started"),
            release_file=os.path.join(workdir, "release"),
        ),
    )
    return [ev, dependent, blocked]


def main(argv: list[str]) -> int:
    prefix, workdir = argv
    result = run_experiment(steps(workdir),
                            ExecutorMainConfig(prefix=prefix, backend="local", max_concurrent=4,
                                               issue="openlab/demo#5"),
                            verbose=False,
                            description="browser test: every state, and a training step's curves",
                            script="experiments/exp5_dashboard_live.py")
    return 0 if result.status in ("SUCCESS", "FAILED") else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
