"""Loader throughput on a 3-source mixture against what the train step consumes (target: >= 10x).

    JAX_PLATFORMS=cpu .venv/bin/python lib/moe_trainer/benchmarks/loader_throughput.py
    .venv/bin/python lib/moe_trainer/benchmarks/loader_throughput.py --preset moe-1b --trainer-steps 0

Three token caches (written through the real ``CacheWriter``, documents of different length distributions,
1M-token shards) are mixed 0.5 / 0.3 / 0.2 with a second stage (0.2 / 0.3 / 0.5) from the middle of the run.
``MixtureLoader.batch(step)`` is timed for ``--steps`` consecutive steps of the preset's batch shape, once
called directly on one thread (``loader``) and once consumed through the trainer's ``Prefetcher``
(``prefetched``, what ``train`` does). The trainer's consumption is the median step time of the preset's real
jitted train step (``harness.JaxStep`` on one random batch) on the same batch shape; ``ratio`` = loader
tokens/s / trainer tokens/s. ``--compare-single`` also times the single-cache ``TrainLoader`` on the first
source, alternating 100-batch passes with the mixture (both then see the same machine load): the cost of the
mixing rule itself.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
from harness import JaxStep, data_parallel

from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, write_shard
from moe_trainer.data.loader import TrainLoader
from moe_trainer.data.mixture import MixtureConfig, MixtureStage, open_mixture
from moe_trainer.presets import load_preset
from moe_trainer.train_config import TrainConfig

SHARD_TOKENS = 1 << 20


def write_source(path: str, tokens: int, mean_doc: int, vocab: int, seed: int) -> str:
    """A cache of ~``tokens`` random tokens in documents of geometric lengths with mean ``mean_doc``."""
    header = CacheHeader(tokenizer={"name": "benchmark"}, vocab_size=vocab, eos_id=0)
    writer = CacheWriter(path, header)
    rng = np.random.default_rng(seed)
    names = []
    for k in range(max(1, tokens // SHARD_TOKENS)):
        lengths = rng.geometric(1 / mean_doc, size=2 * SHARD_TOKENS // mean_doc)
        lengths = lengths[np.cumsum(lengths) <= SHARD_TOKENS]
        flat = rng.integers(1, vocab, size=int(lengths.sum()), dtype=np.int64)
        docs = ((d, "bench", int(d.size) * 4) for d in np.split(flat, np.cumsum(lengths)[:-1]))
        names.append(f"{k:05d}")
        write_shard(path, names[-1], header, docs)
    writer.write_manifest(names)
    return path


def time_loader(mixture: MixtureConfig, cfg: TrainConfig, steps: int) -> dict[str, Any]:
    b, s = cfg.data.batch_size, cfg.data.seq_len
    loader = open_mixture(mixture, b, s, seed=0)
    t0 = time.perf_counter()
    for step in range(steps):
        loader.batch(step)
    direct = time.perf_counter() - t0
    fresh = open_mixture(mixture, b, s, seed=0)  # no warm block/permutation caches from the first pass
    t0 = time.perf_counter()
    with fresh.iterate(0, steps, prefetch=cfg.data.prefetch) as it:
        for _ in it:
            pass
    prefetched = time.perf_counter() - t0
    tokens = steps * b * s
    return {"steps": steps, "tokens": tokens, "loader_tokens_per_s": tokens / direct,
            "prefetched_tokens_per_s": tokens / prefetched, "loader_ms_per_batch": 1e3 * direct / steps,
            "tokens_seen": fresh.tokens_seen(steps)}


def compare_single(mixture: MixtureConfig, cfg: TrainConfig, passes: int = 3) -> dict[str, list[float]]:
    """Tokens/s of the mixture and of a TrainLoader on the first source, alternating 100-batch passes."""
    b, s = cfg.data.batch_size, cfg.data.seq_len
    loaders = {"mixture": open_mixture(mixture, b, s, seed=0),
               "train_loader": TrainLoader(TokenCache(next(iter(mixture.sources.values()))), b, s, 0)}
    out: dict[str, list[float]] = {k: [] for k in loaders}
    for rep in range(passes):
        for name, loader in loaders.items():
            t0 = time.perf_counter()
            for step in range(100 * rep, 100 * rep + 100):
                loader.batch(step)
            out[name].append(100 * b * s / (time.perf_counter() - t0))
    return out


def time_trainer(cfg: TrainConfig, steps: int, warmup: int) -> dict[str, Any]:
    import jax

    step = JaxStep(cfg, batches=1)
    for _ in range(warmup):
        step()
    times = [step() for _ in range(steps)]
    step_s = statistics.median(times)
    return {
        "steps": steps,
        "step_time_s": step_s,
        "step_times_s": times,
        "trainer_tokens_per_s": step.shape[0] * step.shape[1] / step_s,
        "device": str(jax.devices()[0].device_kind),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", help="batch shape and model of the trainer side")
    ap.add_argument("--steps", type=int, default=300, help="loader steps timed")
    ap.add_argument("--tokens-per-source", type=int, default=8 << 20)
    ap.add_argument("--trainer-steps", type=int, default=8, help="timed train steps (0: loader only)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where the caches are written (default: a temp dir)")
    ap.add_argument("--compare-single", action="store_true", help="also time the single-cache TrainLoader")
    args = ap.parse_args()
    cfg = data_parallel(load_preset(args.preset))
    if os.environ.get("JAX_PLATFORMS") == "cpu" and cfg.model.compute_dtype != "float32":
        cfg = dataclasses.replace(cfg, model=cfg.model.replace(compute_dtype="float32"))
    with tempfile.TemporaryDirectory(dir=args.workdir) as root:
        t0 = time.perf_counter()
        sources = {
            name: write_source(f"{root}/{name}", args.tokens_per_source, mean, cfg.model.vocab_size, i)
            for i, (name, mean) in enumerate((("web", 600), ("code", 2500), ("books", 9000)))
        }
        write_s = time.perf_counter() - t0
        mixture = MixtureConfig(
            sources=sources,
            weights={"web": 0.5, "code": 0.3, "books": 0.2},
            stages=(MixtureStage(args.steps // 2, {"web": 0.2, "code": 0.3, "books": 0.5}),),
        )
        report: dict[str, Any] = {
            "preset": args.preset,
            "batch_size": cfg.data.batch_size,
            "seq_len": cfg.data.seq_len,
            "tokens_per_source": args.tokens_per_source,
            "cache_write_s": write_s,
            "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loader": time_loader(mixture, cfg, args.steps),
        }
        if args.compare_single:
            report["mixture_vs_train_loader_tokens_per_s"] = compare_single(mixture, cfg)
    if args.trainer_steps:
        report["trainer"] = time_trainer(cfg, args.trainer_steps, args.warmup)
        report["ratio"] = report["loader"]["loader_tokens_per_s"] / report["trainer"]["trainer_tokens_per_s"]
        report["ratio_prefetched"] = (
            report["loader"]["prefetched_tokens_per_s"] / report["trainer"]["trainer_tokens_per_s"]
        )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
