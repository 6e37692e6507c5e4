"""Step functions for the lab notebook tests: an "evaluation" that writes a given bits-per-byte figure
in eval.json's documented shape (docs/formats.md), and a "training" that writes metrics.jsonl rows."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    output_path: str
    bpb: float
    """The macro bits per byte this fake evaluation reports."""
    accuracy: float = 0.5


def write_eval(cfg: EvalConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    domain = {"loss": cfg.bpb * 0.7, "bpb": cfg.bpb, "tokens": 100, "bytes": 400}
    macro = {"bpb": cfg.bpb, "loss": cfg.bpb * 0.7}
    result = {"domains": {"python": domain}, "micro": domain, "macro": macro}
    with open(os.path.join(cfg.output_path, "eval.json"), "w") as f:
        json.dump(result, f)
    with open(os.path.join(cfg.output_path, "choices.json"), "w") as f:
        json.dump({"macro": {"accuracy": cfg.accuracy}}, f)


@dataclasses.dataclass(frozen=True)
class TrainRowsConfig:
    output_path: str
    final_loss: float


def write_rows(cfg: TrainRowsConfig) -> None:
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "metrics.jsonl"), "w") as f:
        for step in range(1, 4):
            f.write(json.dumps({"step": step, "loss": cfg.final_loss + (3 - step)}) + "\n")
        f.write(json.dumps({"step": 3, "eval": {"macro": {"bpb": 2.5}}}) + "\n")


@dataclasses.dataclass(frozen=True)
class DeclaredEvalConfig(EvalConfig):
    """EvalConfig that declares what `write_eval` writes, as the operators do (marin/status/results.py)."""

    RESULT_METRICS: ClassVar[tuple[str, ...]] = ("eval.json/domains.*.bpb", "eval.json/domains.*.loss",
                                                 "eval.json/macro.bpb", "eval.json/macro.loss",
                                                 "choices.json/macro.accuracy")
    HEADLINE_METRICS: ClassVar[tuple[str, ...]] = ("eval.json/domains.*.bpb", "eval.json/macro.bpb")
