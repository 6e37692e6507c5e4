"""A tiny hand-written bigram language model for trainer tests that do not need the MoE model.

``logits = (embed[inputs] * norm_scale) @ w_out + out_bias``: it has one parameter of each optimizer group
(embedding, norm gain, bias -> no weight decay; a matrix -> weight decay / Muon), a masked token
cross-entropy and a logit z-loss, and the batch dict shape of the real loader.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

VOCAB = 16
DIM = 8


def init_toy(seed: int = 0) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "embed": jax.random.normal(k1, (VOCAB, DIM), jnp.float32) * 0.5,
        "norm_scale": jnp.ones((DIM,), jnp.float32),
        "w_out": jax.random.normal(k2, (DIM, VOCAB), jnp.float32) * 0.5,
        "out_bias": jnp.zeros((VOCAB,), jnp.float32),
    }


def toy_loss(
    params: dict[str, Any], batch: dict[str, jax.Array], total_tokens: jax.Array, n_micro: int
) -> tuple[jax.Array, dict[str, jax.Array]]:
    h = params["embed"][batch["inputs"]] * params["norm_scale"]
    logits = h @ params["w_out"] + params["out_bias"]
    logz = jax.nn.logsumexp(logits, axis=-1)
    ce = logz - jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    mask = batch["loss_mask"]
    ce_sum = jnp.sum(ce * mask)
    z_sum = jnp.sum(jnp.square(logz) * mask)
    loss = (ce_sum + 1e-4 * z_sum) / total_tokens
    return loss, {"ce_sum": ce_sum, "tokens": jnp.sum(mask)}


def cyclic_batch(step: int, batch: int = 8, seq: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Sequences following ``t -> (3t + 1) mod VOCAB`` from a per-(step, row) random start; a random
    quarter of positions masked out, as padding would be."""
    rng = np.random.default_rng([seed, step])
    start = rng.integers(0, VOCAB, size=(batch, 1))
    toks = np.empty((batch, seq + 1), np.int64)
    toks[:, :1] = start
    for i in range(1, seq + 1):
        toks[:, i] = (3 * toks[:, i - 1] + 1) % VOCAB
    mask = (rng.random((batch, seq)) > 0.25).astype(np.float32)
    return {
        "inputs": toks[:, :-1].astype(np.int32),
        "targets": toks[:, 1:].astype(np.int32),
        "segment_ids": np.ones((batch, seq), np.int32),
        "loss_mask": mask,
    }
