"""The language-model training loss: masked token cross-entropy + logit z-loss + the MoE routing losses.

All terms are float32 (the model returns float32 logits whatever its compute dtype):

    loss = (Σ_t m_t·CE_t + logit_z_loss_coef · Σ_t m_t·logsumexp(logits_t)²) / Σ_t m_t   (whole batch)
         + MoEStats.weighted_loss                                                       (per microbatch)

where ``m`` is the batch's ``loss_mask`` and ``weighted_loss`` is the model's coefficient-weighted aux
(Switch-style, only with ``balance="aux_loss"``) and router z-loss. The per-token terms are normalised by the
token count of the whole (accumulated) batch, which makes gradient accumulation exact for them (``step.py``).

By default the token terms are computed by the fused, chunked output head + cross-entropy of
``chunked_loss.py`` (``ModelConfig.loss_chunk_tokens``), which gives the same values and gradients without
materialising the [tokens, vocab] logits; ``loss_chunk_tokens=0`` takes the plain path through ``forward``.

The stats returned are *summed* over microbatches by the train step, so batch means are pre-divided by the
number of microbatches here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from moe_trainer.chunked_loss import chunked_lm_loss
from moe_trainer.config import ModelConfig
from moe_trainer.model import forward, hidden_states, output_head, update_router_bias
from moe_trainer.step import Batch, LossFn, PostUpdateFn


def token_nll(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token negative log-likelihood and log-partition (both fp32, shape of ``targets``)."""
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return logz - target_logit, logz


def loss_vocab_block(cfg: ModelConfig, mesh: Mesh | None = None) -> int:
    """Vocabulary columns per block of the fused loss (0 = whole rows): `cfg.loss_vocab_block`, or when None
    the measured choice (docs/benchmarks/trainer-accel.md): on CPU, blocks of 2048 columns once the vocabulary
    reaches 65,536 (at llama_nano's shape and vocab 128,256: 2.6x the whole-row step; at 32k only whole rows
    were measured, 1.29x Levanter); elsewhere whole rows (not measured there). Never with a "model" mesh axis
    > 1: the head is vocab-sharded there, blocks would gather it."""
    if cfg.loss_vocab_block is not None:
        return cfg.loss_vocab_block
    if mesh is not None and mesh.shape.get("model", 1) > 1:
        return 0
    return 2048 if jax.default_backend() == "cpu" and cfg.vocab_size >= 65536 else 0


def make_lm_loss(cfg: ModelConfig, *, mesh: Mesh | None = None, dispatch: str | None = None) -> LossFn:
    """The :data:`moe_trainer.step.LossFn` of the MoE language model ``cfg``.

    The token terms go through the fused, chunked head + cross-entropy of ``chunked_loss.py`` unless
    ``cfg.loss_chunk()`` is 0 (same values and gradients; less memory traffic and no [tokens, vocab] logits).
    """
    chunk = cfg.loss_chunk()
    vocab_block = loss_vocab_block(cfg, mesh)

    def loss_fn(params: Any, batch: Batch, total_tokens: jax.Array, n_micro: int
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
        mask = batch["loss_mask"].astype(jnp.float32)
        if chunk:
            h, st = hidden_states(params, batch["inputs"], cfg, segment_ids=batch["segment_ids"], mesh=mesh,
                                  dispatch=dispatch)
            token_sum, ce_sum, z_sum = chunked_lm_loss(
                h,
                output_head(params, cfg),
                batch["targets"],
                mask,
                z_coef=cfg.logit_z_loss_coef,
                chunk_tokens=chunk,
                mesh=mesh,
                vocab_block=vocab_block,
            )
        else:
            logits, st = forward(
                params, batch["inputs"], cfg, segment_ids=batch["segment_ids"], mesh=mesh, dispatch=dispatch
            )
            nll, logz = token_nll(logits, batch["targets"])
            ce_sum = jnp.sum(nll * mask)
            z_sum = jnp.sum(jnp.square(logz) * mask)
            token_sum = ce_sum + cfg.logit_z_loss_coef * z_sum
        loss = token_sum / total_tokens + st.weighted_loss / n_micro
        stats = {
            "ce_sum": ce_sum,
            "tokens": jnp.sum(mask),
            "logit_z_sum": z_sum,
            "aux_loss": st.aux_loss / n_micro,
            "router_z_loss": st.router_z_loss / n_micro,
            "expert_load": st.expert_load / n_micro,
            "routing_entropy": st.routing_entropy / n_micro,
            "dropped": st.dropped,
            "assignments": st.assignments,
        }
        return loss, stats

    return loss_fn


def make_router_bias_update(cfg: ModelConfig, rate: float) -> PostUpdateFn | None:
    """The aux-loss-free balancing step (every train step, from the batch's mean expert load), or None."""
    if cfg.balance != "aux_free" or cfg.n_experts == 0:
        return None

    def post_update(params: Any, stats: dict[str, jax.Array], n_micro: int) -> Any:
        del n_micro  # expert_load is already the microbatch mean
        return update_router_bias(params, stats["expert_load"], rate)

    return post_update
