"""The ladder's eval step: one fixed held-out set, evaluated at fixed fractions of a run's own training.

A rung's train step keeps a checkpoint at every evaluation step (25, 50, 75 and 100% of its steps by
default; the ladder builder sets the checkpoint interval and how many are kept). This step evaluates each
of them on the same held-out caches, dropless, with the same windows (``batch_size`` x ``max_batches`` per
domain, so every rung and the target are scored on exactly the same tokens), and writes ``curve.json``::

    {"metric": "micro.bpb",
     "points": [{"step": 76, "fraction": 0.25, "tokens": 38912, "compute_6nd": ..., "compute_trainer": ...,
                 "value": 2.91, "eval": {<eval.json shape: domains, micro, macro>}}, ...],
     "n_params": ..., "flops_per_token": ..., "train": "<the train step's output path>"}

so the fit step can read every rung's curve without knowing its config. ``metric`` is a dotted path into
the eval result (``micro.bpb``: bits per byte pooled over the domains; ``macro.bpb``;
``domains.python.loss``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Mapping
from typing import Any, cast

from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.evaluate import evaluate as evaluate_model
from moe_trainer.jsonio import write_json_atomic
from operators.evaluate import EvaluateConfig, validation_caches
from operators.train import runtime_field

CURVE_FILE = "curve.json"


def metric_value(result: Mapping[str, Any], metric: str) -> float:
    """The value at dotted path ``metric`` of an eval result (``micro.bpb``); a clear error when absent."""
    node: Any = result
    for part in metric.split("."):
        if not isinstance(node, Mapping) or part not in node:
            keys = sorted(node) if isinstance(node, Mapping) else []
            raise KeyError(f"metric {metric!r}: no {part!r} in the eval result (keys there: {keys})")
        node = node[part]
    return float(node)


@dataclasses.dataclass(frozen=True)
class CurveConfig:
    output_path: str
    """Where curve.json is written (the step's own output path)."""
    train: str
    """The train step's output path (its checkpoints/{step} directories are evaluated)."""
    tokenized: str
    """A tokenize step's output path: its validation caches are the held-out set."""
    steps: tuple[int, ...]
    """The checkpoint steps to evaluate (e.g. 25/50/75/100% of the run)."""
    num_steps: int
    """The run's total steps (to record each point's fraction)."""
    tokens_per_step: int
    """Batch size x sequence length of the run."""
    n_params: int
    """Non-embedding active parameters (for 6·N·D)."""
    flops_per_token: float
    """The trainer's training FLOPs per token."""
    metric: str = "micro.bpb"
    """Dotted path of the scored value in the eval result."""
    max_batches: int | None = 128
    """Batches per domain (None: every token of each validation cache)."""
    batch_size: int = 8
    """Windows per batch; with max_batches it fixes which tokens are evaluated, so it is part of identity."""
    progress: bool = runtime_field(default=True)
    """Print one line per evaluated checkpoint."""

    def __post_init__(self) -> None:
        if not self.steps or any(s < 1 for s in self.steps) or list(self.steps) != sorted(set(self.steps)):
            raise ValueError(f"curve: steps={list(self.steps)} must be increasing positive checkpoint steps")
        if self.steps[-1] > self.num_steps:
            raise ValueError(f"curve: step {self.steps[-1]} is beyond the run's num_steps={self.num_steps}")


def evaluate_curve(config: CurveConfig) -> dict[str, Any]:
    """Evaluate every listed checkpoint on the held-out caches; write and return curve.json's content."""
    caches = validation_caches(
        EvaluateConfig(output_path=config.output_path, checkpoint=config.train, tokenized=config.tokenized)
    )
    points = []
    for step in config.steps:
        t0 = time.time()
        model = load_checkpoint(f"{config.train.rstrip('/')}/checkpoints/{step}")
        result = evaluate_model(
            model,
            caches,
            seq_len=model.config.max_seq_len,
            batch_size=config.batch_size,
            max_batches=config.max_batches,
            capacity_factor=None,
        )
        value = metric_value(result, config.metric)
        tokens = step * config.tokens_per_step
        points.append(
            {
                "step": step,
                "fraction": step / config.num_steps,
                "tokens": tokens,
                "compute_6nd": 6.0 * config.n_params * tokens,
                "compute_trainer": config.flops_per_token * tokens,
                "value": value,
                "finite": math.isfinite(value),
                "eval": result,
            }
        )
        if config.progress:
            print(
                f"[curve] step {step}/{config.num_steps}: {config.metric} {value:.4f} "
                f"({time.time() - t0:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    out = {
        "metric": config.metric,
        "points": points,
        "n_params": config.n_params,
        "flops_per_token": config.flops_per_token,
        "tokens_per_step": config.tokens_per_step,
        "num_steps": config.num_steps,
        "train": config.train,
        "caches": caches,
        "max_batches": config.max_batches,
        "batch_size": config.batch_size,
    }
    write_json_atomic(f"{config.output_path.rstrip('/')}/{CURVE_FILE}", out)
    # json.loads is typed Any; a dict dumped to JSON reads back as a dict
    return cast("dict[str, Any]", json.loads(json.dumps(out)))
