"""A real training step for the ledger tests: the train operator on a tiny model and a toy token cache,
whose first attempt is killed (SIGKILL of its own worker, as the system kills it) right after its first
complete checkpoint; later attempts train to the end, resuming from that checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

VOCAB = 64


def write_toy_cache(path: str) -> str:
    """A token cache of byte-level ids (vocab 64) over a little text, through the trainer's own writers."""
    from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard

    header = CacheHeader(tokenizer={"name": "toy-bytes"}, vocab_size=VOCAB, eos_id=0)
    text = "def f(x):\n    return x + 1\n" * 20 + "The quick brown fox jumps over the lazy dog. " * 20
    docs = [([b % (VOCAB - 1) + 1 for b in line.encode()], "toy", len(line)) for line in text.split("\n")]
    write_shard(path, "00000", header, docs)
    CacheWriter(path, header).write_manifest(["00000"])
    return path


@dataclasses.dataclass(frozen=True)
class KilledTrainConfig:
    output_path: str
    train_cache: str
    counter_file: str
    num_steps: int = 12
    checkpoint_every: int = 5


def _kill_after_checkpoint(progress_file: str) -> None:
    """SIGKILL this process once the progress file reports a complete checkpoint and a step past it."""
    path = Path(progress_file)
    while True:
        try:
            progress = json.loads(path.read_text())
        except (OSError, ValueError):
            progress = {}
        done = progress.get("checkpoint_step")
        if done and progress.get("step", 0) > done:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)


def train_killed_once(config: KilledTrainConfig) -> None:
    from operators.train import TrainConfig, train

    counter = Path(config.counter_file)
    attempt = len(counter.read_text().split()) + 1 if counter.exists() else 1
    with open(counter, "a") as f:
        f.write(f"{attempt}\n")
    if attempt == 1:
        threading.Thread(
            target=_kill_after_checkpoint, args=(os.environ["MARIN_PROGRESS_FILE"],), daemon=True
        ).start()
    train(
        TrainConfig(
            output_path=config.output_path,
            train_cache=config.train_cache,
            model={"vocab_size": VOCAB, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                   "head_dim": 8, "d_ff": 32, "n_experts": 4, "top_k": 2, "expert_d_ff": 16},
            overrides={"schedule.warmup_steps": 2},
            num_steps=config.num_steps,
            batch_size=2,
            seq_len=16,
            checkpoint_every=config.checkpoint_every,
            wandb_mode="disabled",
            progress_bar=False,
        )
    )


def write_random_cache(path: str, vocab: int, tokens: int, seed: int = 0) -> str:
    """A token cache of random ids (documents of 100-400 tokens) for throughput-shaped runs (the tiny
    preset's vocabulary), through the trainer's own writers."""
    import numpy as np

    from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard

    rng = np.random.default_rng(seed)
    header = CacheHeader(tokenizer={"name": "random"}, vocab_size=vocab, eos_id=0)
    docs, total = [], 0
    while total < tokens:
        n = int(rng.integers(100, 400))
        docs.append((rng.integers(1, vocab, size=n).astype(np.uint32), "random", 4 * n))
        total += n
    write_shard(path, "00000", header, docs)
    CacheWriter(path, header).write_manifest(["00000"])
    return path


@dataclasses.dataclass(frozen=True)
class TimedTrainConfig:
    output_path: str
    train_cache: str
    num_steps: int = 60
    checkpoint_every: int = 10
    batch_size: int = 16  # the tiny preset's batch and sequence length
    seq_len: int = 128


def timed_gang_train(config: TimedTrainConfig) -> None:
    """The train operator on the tiny preset; each member first records (under output_path/timing/) when it
    entered and when jax.distributed was up (the trainer's own initialize is then a no-op)."""
    from moe_trainer import distributed
    from operators.train import TrainConfig, train

    entered = time.time()
    distributed.initialize()
    import ray

    record = {
        "rank": int(os.environ.get("MARIN_GANG_RANK", "0")),
        "node": os.environ.get("MARIN_NODE_TAG", ""),
        "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        "entered": entered,
        "jax_up": time.time(),
    }
    timing = Path(config.output_path, "timing")
    timing.mkdir(parents=True, exist_ok=True)
    (timing / f"{record['rank']}-{os.getpid()}.json").write_text(json.dumps(record))
    train(
        TrainConfig(
            output_path=config.output_path,
            train_cache=config.train_cache,
            preset="tiny",
            num_steps=config.num_steps,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            checkpoint_every=config.checkpoint_every,
            wandb_mode="disabled",
            progress_bar=False,
        )
    )
