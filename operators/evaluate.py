"""evaluate: a training checkpoint plus validation token caches -> ``eval.json``, per domain, computed
dropless.

Outputs under ``output_path``::

    eval.json  # {"domains": {"<domain>": {"loss", "bpb", "tokens", "bytes"}}, "micro": {...}, "macro": {...}}
    eval_info.json    # what was evaluated: checkpoint, caches, context length, wall time

``loss`` is nats per target token and ``bpb`` bits per UTF-8 byte of the original documents: the summed loss
of every token of the cache (each is a target exactly once, EOS included) divided by ``ln 2`` times the bytes
the tokenize step recorded for the documents. ``micro`` pools the sums of all domains; ``macro`` is the
unweighted mean of the per-domain figures. The numbers come from ``moe_trainer.evaluate.evaluate``; routing is
dropless (no expert capacity), so a token's score never depends on which other tokens share its batch.

In a gang step every member evaluates the whole checkpoint on its own devices (no ``jax.distributed``: the
figures do not depend on the process count) and only rank 0 writes the outputs.

The validation caches are given explicitly by domain (``validation``), or found in a tokenize step's output
(``tokenized``: every cache its ``tokenize.json`` lists under ``validation``), or both (explicit ones win).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import fsspec

from moe_trainer import distributed
from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.evaluate import evaluate as evaluate_model
from moe_trainer.jsonio import write_json_atomic
from operators.train import runtime_field


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    output_path: str
    """Where eval.json and eval_info.json are written (the step's own output path)."""
    checkpoint: str
    """A train step's output path (its newest complete checkpoint is used), its checkpoints/ directory, or one
    checkpoint step's directory."""
    validation: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Validation token caches by domain."""
    tokenized: str | None = None
    """A tokenize step's output path: every validation cache it wrote is evaluated (by domain)."""
    seq_len: int | None = None
    """Context length of the evaluation windows (None: the model's max_seq_len, which the train step sets to
    its training sequence length)."""
    max_batches: int | None = None
    """Evaluate at most this many batches per domain (None: every token of every cache)."""
    batch_size: int = runtime_field(default=8)
    """Windows per forward pass (memory/speed only: padding is masked, so the figures do not depend on it)."""

    # What this step writes, for criteria checked before a run and for the run's summary (marin/status/
    # results.py): FILE/PATH patterns, `*` a domain.
    RESULT_METRICS: ClassVar[tuple[str, ...]] = tuple(
        f"eval.json/{group}.{key}" for group in ("domains.*", "micro", "macro")
        for key in ("bpb", "loss", "tokens", "bytes") if group != "macro" or key in ("bpb", "loss"))
    HEADLINE_METRICS: ClassVar[tuple[str, ...]] = ("eval.json/domains.*.bpb", "eval.json/micro.bpb",
                                                   "eval.json/macro.bpb")

    def __post_init__(self) -> None:
        if not self.validation and self.tokenized is None:
            raise ValueError("evaluate: give validation caches by domain (validation={'python': path}) or a "
                             "tokenize step's output (tokenized=output_path_of(tokenize_step))")
        for name in ("seq_len", "max_batches"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"evaluate: {name}={value} must be >= 1 or None")
        if self.batch_size < 1:
            raise ValueError(f"evaluate: batch_size={self.batch_size} must be >= 1")


def validation_caches(config: EvaluateConfig) -> dict[str, str]:
    """Domain -> validation cache path: the tokenize step's caches, then the explicit ones."""
    caches: dict[str, str] = {}
    if config.tokenized is not None:
        root = config.tokenized.rstrip("/")
        path = f"{root}/tokenize.json"
        fs, p = fsspec.core.url_to_fs(path)
        if not fs.exists(p):
            raise FileNotFoundError(f"evaluate: {path} is missing; tokenized= must be the output path of a "
                                    "tokenize step (operators/tokenize.py)")
        with fs.open(p, "r") as f:
            listed = json.load(f).get("validation") or {}
        caches.update({domain: f"{root}/{rel}" for domain, rel in sorted(listed.items())})
    caches.update(config.validation)
    if not caches:
        raise ValueError(f"evaluate: no validation caches: {config.tokenized} has no validation split "
                         "(ingest "
                         "with validation_fraction > 0) and validation= is empty")
    return caches


def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """Evaluate the checkpoint on every validation cache; write and return eval.json's content."""
    caches = validation_caches(config)
    t0 = time.time()
    model = load_checkpoint(config.checkpoint)
    seq_len = config.seq_len or model.config.max_seq_len
    print(f"[evaluate] {config.checkpoint}: domains {', '.join(caches)}, windows of {seq_len} tokens, "
          "dropless",
          file=sys.stderr, flush=True)
    result = evaluate_model(model, caches, seq_len=seq_len, batch_size=config.batch_size,
                            max_batches=config.max_batches, capacity_factor=None)
    out = config.output_path.rstrip("/")
    if distributed.is_primary():
        write_json_atomic(f"{out}/eval.json", result)
        write_json_atomic(f"{out}/eval_info.json", {
            "checkpoint": config.checkpoint, "caches": caches, "seq_len": seq_len,
            "max_batches": config.max_batches, "dropless": True, "wall_s": time.time() - t0})
    for domain, row in result["domains"].items():
        print(f"[evaluate] {domain}: {row['bpb']:.4f} bits/byte, {row['loss']:.4f} nats/token over "
              f"{row['tokens']} tokens / {row['bytes']} bytes", file=sys.stderr)
    print(f"[evaluate] micro {result['micro']['bpb']:.4f} bits/byte, macro {result['macro']['bpb']:.4f} "
          "bits/byte",
          file=sys.stderr, flush=True)
    return result


__all__ = ["EvaluateConfig", "evaluate", "validation_caches"]
