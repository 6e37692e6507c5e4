"""One process of a multi-host test run (test_multihost.py starts one per gang member, or one alone).

    python multihost_worker.py '<json spec>'

The spec names the run: ``out`` (output dir), ``train``/``val`` (token caches), ``num_steps``, ``every``
(checkpoint interval), ``run_steps``; ``die_at`` makes the process SIGKILL itself (a hard kill, no cleanup)
when its loader is asked for that step index once the checkpoint of ``die_at`` steps is complete on disk, so
the gang dies in the middle of the next step. The gang comes from the MARIN_GANG_* variables set by the test;
the device count from XLA_FLAGS. Prints one JSON line: the TrainResult, the process index/count, the devices.

``write_cache`` (used by the test) builds the synthetic token caches: arithmetic progressions mod 63 with 3%
noise, the same data family as test_train.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 64


def write_cache(path: Path, n_docs: int, seed: int, domain: str) -> str:
    from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard

    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        length = int(rng.integers(24, 90))
        start, stride = int(rng.integers(0, 63)), int(rng.choice([1, 2, 5, 9]))
        toks = (start + stride * np.arange(length)) % 63 + 1
        noise = rng.random(length) < 0.03
        toks[noise] = rng.integers(1, VOCAB, size=int(noise.sum()))
        docs.append((toks, domain, 3 * length))
    header = CacheHeader(tokenizer={"name": "synthetic"}, vocab_size=VOCAB, eos_id=0)
    writer = CacheWriter(str(path), header)
    write_shard(str(path), "00000", header, docs)
    writer.write_manifest(["00000"])
    return str(path)


def config(spec: dict[str, Any]) -> Any:
    """The tiny preset on the synthetic caches, fp32 at matmul precision "highest" (CPU runs comparable to
    ~1e-6), shortened to a few steps of 8 x 64 tokens; every field the spec does not name is the preset's."""
    from moe_trainer.checkpoint import CheckpointConfig
    from moe_trainer.distributed import DistributedConfig
    from moe_trainer.evaluate import EvalConfig
    from moe_trainer.metrics import MetricsConfig
    from moe_trainer.presets import load_preset
    from moe_trainer.train_config import MeshConfig

    tc = load_preset("tiny")
    return dataclasses.replace(
        tc,
        model=tc.model.replace(max_seq_len=64),
        data=dataclasses.replace(tc.data, train_cache=spec["train"], validation=spec.get("val", {}),
                                 seq_len=64, batch_size=8, seed=1, prefetch=1),
        schedule=dataclasses.replace(tc.schedule, warmup_steps=2),
        checkpoint=CheckpointConfig(every_steps=spec["every"], keep=3),
        eval=EvalConfig(every_steps=0, batch_size=8, max_batches=2),
        metrics=MetricsConfig(wandb_mode="offline", progress_bar=False),
        mesh=MeshConfig(data=-1),
        distributed=DistributedConfig(initialization_timeout_s=60, heartbeat_timeout_s=10),
        num_steps=spec["num_steps"], run_steps=spec.get("run_steps"), output_dir=spec["out"],
        matmul_precision="highest")


class DieAt:
    """The token-cache loader, except that asking for step ``die_at`` (once checkpoint ``die_at`` is complete)
    kills the process."""

    def __init__(self, cfg: Any, die_at: int) -> None:
        from moe_trainer.data.cache import TokenCache
        from moe_trainer.data.loader import TrainLoader

        self.loader = TrainLoader(TokenCache(cfg.data.train_cache), cfg.data.batch_size, cfg.data.seq_len,
                                  cfg.data.seed)
        self.ckpt_dir, self.die_at = Path(cfg.output_dir) / "checkpoints", die_at

    def batch(self, step: int) -> dict[str, np.ndarray]:
        if step == self.die_at:
            deadline = time.time() + 120
            while not (self.ckpt_dir / str(self.die_at) / "state").is_dir() and time.time() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.loader.batch(step)


def main() -> None:
    spec = json.loads(sys.argv[1])
    import jax

    from moe_trainer.train import train

    cfg = config(spec)
    source = DieAt(cfg, spec["die_at"]) if spec.get("die_at") is not None else None
    result = train(cfg, batch_source=source)
    print(json.dumps({"result": dataclasses.asdict(result), "process_index": jax.process_index(),
                      "process_count": jax.process_count(), "devices": jax.device_count(),
                      "local_devices": jax.local_device_count()}, default=str), flush=True)


if __name__ == "__main__":
    main()
