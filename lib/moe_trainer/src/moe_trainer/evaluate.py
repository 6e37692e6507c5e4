"""Held-out evaluation: loss and bits-per-byte per domain, with micro and macro averages (Paloma style).

Each domain is one validation token cache. Every token of the cache is a target exactly once (the data
library's ``EvalLoader``: non-overlapping windows, documents kept apart by segment ids), so

    loss_d = Σ NLL / tokens_d            (nats per token)
    bpb_d  = Σ NLL / (ln 2 · bytes_d)    (bytes_d = UTF-8 bytes of the original documents, from the manifest)

``micro`` pools the sums over all domains; ``macro`` is the unweighted mean of the per-domain values (what
Paloma and Marin report as ``macro_loss``/``macro_bpb``). Each domain also gets ``loss_stderr``/``bpb_stderr``
(documents as the units: ``_DocumentSums``) and ``documents``, and ``macro`` the standard error of its mean.
The result has the ``eval.json`` shape of docs/formats.md. Evaluation is dropless by default
(``capacity_factor=None``): a capacity-limited model would
otherwise be scored on the luck of its batch composition.

On a mesh, each batch is placed with the trainer's batch sharding (rows over data x expert). In a multi-host
run every process reads the same evaluation batch and keeps the rows of its own devices; the sums come back
replicated, so every process returns the same figures, equal to one process's up to the order of the
reductions (only process 0 writes them anywhere; see train.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import TokenCache
from moe_trainer.data.loader import EvalLoader
from moe_trainer.loss import token_nll
from moe_trainer.model import Model, forward
from moe_trainer.sharding import logical_to_spec


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation during training."""

    every_steps: int = 0
    """Evaluate every this many steps (0: only at the end of the run, when validation caches are given)."""
    batch_size: int = 8
    """Sequences per evaluation batch."""
    max_batches: int | None = None
    """Evaluate at most this many batches per domain (None: the whole cache; bpb then uses the bytes of the
    evaluated fraction, pro rata by tokens)."""

    def __post_init__(self) -> None:
        if self.every_steps < 0 or self.batch_size < 1:
            raise ValueError(f"eval.every_steps={self.every_steps} must be >= 0 and eval.batch_size="
                             f"{self.batch_size} >= 1")


@partial(jax.jit, static_argnames=("cfg", "mesh", "dispatch", "capacity_factor"))
def _batch_nll(params: Any, batch: dict[str, jax.Array], cfg: ModelConfig, mesh: Mesh | None,
               dispatch: str | None, capacity_factor: float | None | Literal["config"]
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits, _ = forward(params, batch["inputs"], cfg, segment_ids=batch["segment_ids"], mesh=mesh,
                        dispatch=dispatch, capacity_factor=capacity_factor)
    nll, _ = token_nll(logits, batch["targets"])
    mask = batch["loss_mask"]
    return jnp.sum(nll * mask), jnp.sum(mask), nll * mask


def _place(batch: dict[str, np.ndarray], mesh: Mesh | None) -> dict[str, jax.Array]:
    """The batch on the default device, or on ``mesh`` split by rows (global arrays in a multi-host run)."""
    if mesh is None:
        return {key: jnp.asarray(v) for key, v in batch.items()}
    shape = batch["inputs"].shape
    sharding = NamedSharding(mesh, logical_to_spec(("batch", "seq"), shape, mesh))
    return {key: jax.device_put(v, sharding) for key, v in batch.items()}


class _DocumentSums:
    """Summed NLL and target tokens per document of one cache, for the standard error of a domain's figures.

    Target j of evaluation window w is cache token ``w * seq_len + j``, which belongs to document d when
    ``doc_starts[d] <= token < doc_starts[d + 1]``. Batches whose per-token losses are not all on this
    process (a multi-host mesh) are not counted, and the standard error is then left out."""

    def __init__(self, cache: TokenCache, batch_size: int, seq_len: int) -> None:
        self.starts = np.asarray(cache.doc_starts, dtype=np.int64)
        self.num_tokens, self.batch_size, self.seq_len = cache.num_tokens, batch_size, seq_len
        docs = max(len(self.starts) - 1, 0)
        self.nll, self.tokens = np.zeros(docs), np.zeros(docs)
        self.complete = docs > 0

    def add(self, k: int, per_token: jax.Array) -> None:
        if not self.complete or not per_token.is_fully_addressable:
            self.complete = False
            return
        values = np.asarray(per_token, dtype=np.float64)  # (batch, seq)
        token = ((k * self.batch_size + np.arange(values.shape[0]))[:, None] * self.seq_len
                 + np.arange(values.shape[1])[None, :])
        inside = token < self.num_tokens
        doc = np.searchsorted(self.starts, token[inside], side="right") - 1
        self.nll += np.bincount(doc, weights=values[inside], minlength=len(self.nll))
        self.tokens += np.bincount(doc, minlength=len(self.tokens))

    def stderr(self, nbytes: float) -> dict[str, float | int]:
        """``loss_stderr`` and ``bpb_stderr``: the standard error of the domain's summed NLL with documents as
        the units (a ratio estimator: residuals ``nll_d - loss * tokens_d``, so a long document weighs by its
        length), divided as the figures are; bytes are taken as proportional to tokens within the domain.
        Empty when fewer than two documents were evaluated or a batch was not counted."""
        seen = self.tokens > 0
        n = int(seen.sum())
        if not self.complete or n < 2:
            return {}
        y, x = self.nll[seen], self.tokens[seen]
        loss = y.sum() / x.sum()
        se_sum = math.sqrt(n / (n - 1) * float(((y - loss * x) ** 2).sum()))
        return {"loss_stderr": se_sum / float(x.sum()),
                "bpb_stderr": se_sum / (math.log(2) * max(nbytes, 1.0)), "documents": n}


def _summary(nll: float, tokens: float, nbytes: float) -> dict[str, float]:
    return {"loss": nll / max(tokens, 1.0), "bpb": nll / (math.log(2) * max(nbytes, 1.0)),
            "tokens": int(tokens), "bytes": int(round(nbytes))}


def evaluate(
    model: Model,
    caches: Mapping[str, str | TokenCache],
    *,
    seq_len: int | None = None,
    batch_size: int = 8,
    max_batches: int | None = None,
    capacity_factor: float | None | Literal["config"] = None,
    mesh: Mesh | None = None,
    dispatch: str | None = None,
) -> dict[str, Any]:
    """Loss and bpb per domain plus micro/macro averages: ``{"domains": {...}, "micro": {...}, "macro":
    {...}}``.

    ``caches`` maps a domain name to its validation cache (path or opened ``TokenCache``). ``seq_len``
    defaults to the model's ``max_seq_len``. ``capacity_factor=None`` (default) is dropless; "config" uses the
    model's training capacity. ``dispatch`` defaults to the config's backend when a mesh is given, otherwise
    to "ragged" (expert-parallel backends need a mesh).
    """
    if not caches:
        raise ValueError("evaluate needs at least one validation cache: pass {domain: cache_path}")
    cfg = model.config
    seq_len = seq_len or cfg.max_seq_len
    if dispatch is None and mesh is None and cfg.dispatch.startswith("ep_"):
        dispatch = "ragged"
    domains: dict[str, dict[str, float]] = {}
    raw: list[tuple[float, float, float]] = []  # (nll, tokens, bytes) per domain, for the micro average
    for name, cache in caches.items():
        tc = cache if isinstance(cache, TokenCache) else TokenCache(cache)
        if tc.vocab_size > cfg.vocab_size:
            raise ValueError(f"validation cache {tc.path} (domain {name!r}) has vocab_size {tc.vocab_size} "
                             "but "
                             f"the model has {cfg.vocab_size}: it was tokenized with another tokenizer")
        loader = EvalLoader(tc, batch_size=batch_size, seq_len=seq_len)
        n_batches = loader.num_batches if max_batches is None else min(max_batches, loader.num_batches)
        nll_sum, tok_sum = 0.0, 0.0
        docs = _DocumentSums(tc, batch_size, seq_len)
        for k in range(n_batches):
            batch = _place(loader.batch(k), mesh)
            nll, tok, per_token = _batch_nll(model.params, batch, cfg, mesh, dispatch, capacity_factor)
            nll_sum += float(nll)
            tok_sum += float(tok)
            docs.add(k, per_token)
        nbytes = loader.num_bytes * (tok_sum / max(loader.num_targets, 1))
        domains[name] = {**_summary(nll_sum, tok_sum, nbytes), **docs.stderr(nbytes)}
        raw.append((nll_sum, tok_sum, nbytes))
    micro = _summary(*(sum(col) for col in zip(*raw, strict=True)))
    macro: dict[str, float] = {"loss": float(np.mean([d["loss"] for d in domains.values()])),
                               "bpb": float(np.mean([d["bpb"] for d in domains.values()]))}
    if all("bpb_stderr" in d for d in domains.values()):  # independent domains: the mean's standard error
        for key in ("loss_stderr", "bpb_stderr"):
            macro[key] = math.sqrt(sum(d[key] ** 2 for d in domains.values())) / len(domains)
    return {"domains": domains, "micro": micro, "macro": macro}
