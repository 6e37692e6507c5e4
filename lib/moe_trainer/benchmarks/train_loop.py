"""The whole ``train()`` call, not only its step: setup, the loop (rows, progress, watcher), checkpoints.

    JAX_PLATFORMS=cpu python lib/moe_trainer/benchmarks/train_loop.py [--steps 40 --every 20]

Trains the tiny preset on random tokens (a caller's batch source, so no token cache is needed) twice in one
process, each into a fresh output directory: the first call compiles the step, the second reuses the cached
executable, and its wall time and ``TrainResult.tokens_per_s`` are what this prints (JSON), with the
checkpoint interval ``--every`` so that the save path is timed too. It uses only names that existed before
the trainer's reshape (issue 26: ``train``, ``TrainConfig``, ``load_preset``), so ``benchmarks/ab.sh`` can run
this one script against the library of an earlier revision and of this checkout, side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from typing import Any

import jax
import numpy as np

from moe_trainer.presets import load_preset
from moe_trainer.train import train


class RandomTokens:
    """Uniform random tokens of the config's shape, a function of the step alone (as the loader's are)."""

    def __init__(self, vocab: int, batch: int, seq: int) -> None:
        self.vocab, self.batch_size, self.seq = vocab, batch, seq

    def batch(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(step)
        toks = rng.integers(0, self.vocab, (self.batch_size, self.seq + 1), dtype=np.int32)
        return {"inputs": toks[:, :-1], "targets": toks[:, 1:],
                "segment_ids": np.zeros((self.batch_size, self.seq), np.int32),
                "loss_mask": np.ones((self.batch_size, self.seq), np.float32)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per train() call")
    ap.add_argument("--every", type=int, default=20, help="checkpoint interval (steps)")
    args = ap.parse_args()
    base = load_preset("tiny")
    source = RandomTokens(base.model.vocab_size, base.data.batch_size, base.data.seq_len)
    out: dict[str, Any] = {"steps": args.steps, "checkpoint_every": args.every}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("first", "second"):
            cfg = dataclasses.replace(
                base, num_steps=args.steps, output_dir=os.path.join(tmp, name),
                checkpoint=dataclasses.replace(base.checkpoint, every_steps=args.every),
                metrics=dataclasses.replace(base.metrics, wandb_mode="disabled", progress_bar=False),
            )
            t0 = time.perf_counter()
            result = train(cfg, batch_source=source)
            out[name] = {"wall_s": round(time.perf_counter() - t0, 3),
                         "tokens_per_s": round(result.tokens_per_s, 1), "loss": result.loss}
    out["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__,
                      "devices": jax.device_count()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
