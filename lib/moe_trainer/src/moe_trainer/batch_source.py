"""Where ``train``'s batches come from: the token-cache loaders of one process's rows, or a caller's source.

``open_source`` opens the training caches of ``config.data`` (one cache, or a weighted mixture of several) as
the data library's loader of this process's rows ``[lo, hi)`` of every global batch, after checking what a run
could only discover later: a cache whose vocabulary exceeds the model's, rows that do not split the batch
into equal aligned blocks. A caller's own ``BatchSource`` (notebooks, tests) gives global batches; ``rows_of``
cuts them to this process's rows. Either way a batch is a function of the step index alone, so a resumed run
reads exactly the batches it would have read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import jax
import numpy as np

from moe_trainer.train_config import TrainConfig


class BatchSource(Protocol):
    """What ``train`` reads batches from: the global batch of a step, as numpy arrays by field."""

    def batch(self, step: int) -> dict[str, np.ndarray]: ...


def progress_of(source: BatchSource) -> Callable[[int], dict[str, float]]:
    """Per-source metrics of a data position (a mixture's tokens/epochs per source); none for other sources.
    """
    progress = getattr(source, "progress", None)
    return progress if callable(progress) else (lambda _: {})


def open_source(config: TrainConfig, rows: tuple[int, int]) -> BatchSource:
    """The token-cache loader of this process's rows ``[lo, hi)`` of every global batch."""
    from moe_trainer.data.cache import TokenCache
    from moe_trainer.data.loader import TrainLoader
    from moe_trainer.data.mixture import MixtureLoader

    data = config.data
    if not data.train_cache and not data.mixture.enabled:
        raise ValueError(
            "data.train_cache is empty: point it at a token cache written by the tokenize step "
            "(or give data.mixture.sources and weights)"
        )
    named = dict(data.mixture.sources) if data.mixture.enabled else {"train_cache": data.train_cache}
    caches = {name: TokenCache(path) for name, path in named.items()}
    for name, cache in caches.items():
        if cache.vocab_size > config.model.vocab_size:
            field = "data.train_cache" if not data.mixture.enabled else f"data.mixture.sources.{name}"
            raise ValueError(
                f"{field} {cache.path} has vocab_size {cache.vocab_size} > model.vocab_size "
                f"{config.model.vocab_size}: raise model.vocab_size or use the matching tokenizer"
            )
    lo, hi = rows
    b = data.batch_size
    if lo % (hi - lo) or b % (hi - lo):
        raise ValueError(
            f"process {jax.process_index()} holds batch rows [{lo}, {hi}) of {b}: not an aligned "
            "equal block; choose data.batch_size and mesh so the batch splits evenly by process"
        )
    split = {"process_index": lo // (hi - lo), "process_count": b // (hi - lo)}
    if data.mixture.enabled:
        return MixtureLoader(caches, data.mixture, b, data.seq_len, data.seed, **split)
    return TrainLoader(caches["train_cache"], b, data.seq_len, data.seed, **split)


def rows_of(source: BatchSource, rows: tuple[int, int]) -> Callable[[int], dict[str, np.ndarray]]:
    """``source``'s global batches cut to this process's rows ``[lo, hi)``."""
    lo, hi = rows
    return lambda step: {k: v[lo:hi] for k, v in source.batch(step).items()}
