"""What the trainer benchmarks share: the real compiled train step of a config, run on random tokens.

``JaxStep(cfg)`` compiles the train step ``train`` itself runs (``compiled.compile_train_step``: loss,
gradients, clipping, optimizer, health guards) for ``cfg``'s model and batch shape, initialises its state
and, per call, runs one step on one of a few fixed random batches and returns the step's wall seconds
(dispatch to ``block_until_ready``). ``train_throughput.py``, ``loader_throughput.py`` and
``levanter_compare.py`` all time this one object, so their figures measure the same thing. The scripts
import it as a sibling module (``from harness import JaxStep``): they run by path, with this directory on
``sys.path``.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from moe_trainer.compiled import Compiled, StepSpec, build_mesh, compile_train_step
from moe_trainer.train_config import TrainConfig


def random_batch(cfg: TrainConfig, seed: int) -> dict[str, np.ndarray]:
    """A batch of ``cfg``'s shape: uniform random tokens (``seed`` picks them), no padding, full loss mask."""
    rng = np.random.default_rng(seed)
    b, s = cfg.data.batch_size, cfg.data.seq_len
    toks = rng.integers(0, cfg.model.vocab_size, (b, s + 1), dtype=np.int32)
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "segment_ids": np.zeros((b, s), np.int32),
            "loss_mask": np.ones((b, s), np.float32)}


def compile_step(cfg: TrainConfig, xla_options: tuple[tuple[str, str], ...] | None = None) -> Compiled:
    """The jitted train step and init of ``cfg`` on the mesh of ``cfg.mesh`` (cached, as in ``train``)."""
    return compile_train_step(
        StepSpec.of(cfg),
        build_mesh(cfg.mesh),
        xla_options,
    )


def data_parallel(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` on a mesh of every device along the data axis (no expert or tensor parallelism)."""
    return dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, data=-1, expert=1, model=1))


def parse_value(text: str) -> object:
    """A command-line value: an int, a float, true/false, none/null, else the string itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None, "null": None}.get(text.lower(), text)


class JaxStep:
    """Our compiled train step for a config, on ``batches`` random batches of its shape taken in turn."""

    def __init__(
        self, cfg: TrainConfig, xla_options: tuple[tuple[str, str], ...] | None = None, batches: int = 4
    ) -> None:
        self.cfg = cfg
        self.comp = compile_step(cfg, xla_options)
        self.mesh = self.comp.batch_sharding.mesh
        self.shape = (cfg.data.batch_size, cfg.data.seq_len)
        self.state = self.comp.init()
        sharding = self.comp.batch_sharding
        self.batches = [jax.device_put(random_batch(cfg, i), sharding) for i in range(batches)]
        self.i = 0
        self.loss = float("nan")
        self.cpu: list[float] = []

    def __call__(self) -> float:
        t, c = time.perf_counter(), time.process_time()
        self.state, m = self.comp.step(self.state, self.batches[self.i % len(self.batches)])
        jax.block_until_ready(m)
        self.i += 1
        self.loss = float(m["loss"])
        self.cpu.append(time.process_time() - c)
        return time.perf_counter() - t
