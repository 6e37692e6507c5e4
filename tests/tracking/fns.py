"""Importable step functions for the tracker's end-to-end tests (workers import them by module path)."""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class TrainLikeConfig:
    output_path: str
    steps: int = 5


def train_like(cfg: TrainLikeConfig) -> None:
    """Writes what a trainer step leaves behind: metrics.jsonl and wandb.json (docs/formats.md)."""
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "metrics.jsonl"), "w") as f:
        for step in range(1, cfg.steps + 1):
            f.write(json.dumps({"step": step, "loss": 4.0 / step, "lr": 1e-3}) + "\n")
    with open(os.path.join(cfg.output_path, "wandb.json"), "w") as f:
        json.dump({"project": "tiny", "run_id": "r123", "mode": "offline", "dir": cfg.output_path,
                   "url": None}, f)


@dataclasses.dataclass(frozen=True)
class EvalLikeConfig:
    model_path: str
    output_path: str


def eval_like(cfg: EvalLikeConfig) -> None:
    """Writes an eval.json with per-domain bits per byte."""
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "eval.json"), "w") as f:
        json.dump({"domains": {"code": {"loss": 1.0, "bpb": 0.75, "tokens": 10, "bytes": 40},
                               "prose": {"loss": 2.0, "bpb": 1.25, "tokens": 10, "bytes": 30}},
                   "macro": {"bpb": 1.0}}, f)


@dataclasses.dataclass(frozen=True)
class FailConfig:
    output_path: str
    message: str = "lr must be positive"


def fail(cfg: FailConfig) -> None:
    print("about to fail")
    raise ValueError(cfg.message)
