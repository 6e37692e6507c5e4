"""The model: embedding -> n pre-norm blocks (attention, then dense or MoE MLP) -> final norm -> output head.

`forward` is the one function the trainer differentiates. The residual stream is kept in float32; each block
reads a normalised copy in the compute dtype (bfloat16 or float32) and its output is added back in float32;
the router, norms, attention softmax and the logits are float32.

Layers run through `layer_stack.run_layers`: runs of identically-shaped layers are stacked inside the jitted
function and executed by `jax.lax.scan` (`ModelConfig.scan_layers`), with the remat policy of
`ModelConfig.remat`/`remat_policy`; the stored parameter tree stays a list of per-layer dicts.

Padding convention: tokens whose `segment_ids` are negative are padding. They are never routed to experts and
are excluded from the routing statistics (the trainer must also mask them out of its loss).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from moe_trainer.attention import attention, segment_positions
from moe_trainer.config import ModelConfig
from moe_trainer.layer_stack import run_layers
from moe_trainer.layers import Params, cast, dtype_of, linear, rms_norm, swiglu
from moe_trainer.moe import LayerStats, moe_block
from moe_trainer.params import init_params, param_logical_axes
from moe_trainer.sharding import constrain

__all__ = ["Model", "MoEStats", "forward", "hidden_states", "init_params", "output_head",
           "param_logical_axes",
           "update_router_bias"]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class MoEStats:
    """Routing statistics of one forward pass.

    Loss terms are the *unweighted* means over MoE layers; `weighted_loss` is what the trainer adds to the LM
    loss: aux_loss_coef * aux_loss (balance="aux_loss" only) + router_z_loss_coef * router_z_loss. With no MoE
    layers every loss is 0.
    """

    aux_loss: jax.Array
    """Switch-style load-balancing loss, mean over MoE layers (1.0 = perfectly balanced)."""
    router_z_loss: jax.Array
    """mean(logsumexp(router_logits)^2), mean over MoE layers."""
    weighted_loss: jax.Array
    """The coefficient-weighted sum of the above to add to the training loss."""
    expert_load: jax.Array
    """float32 [n_moe_layers, n_experts]: fraction of each layer's assignments routed to each expert."""
    routing_entropy: jax.Array
    """float32 [n_moe_layers]: mean per-token entropy (nats) of the router distribution."""
    dropped: jax.Array
    """int32: assignments dropped by the capacity limit, summed over layers."""
    assignments: jax.Array
    """int32: routed assignments (valid tokens * top_k), summed over layers."""

    @property
    def drop_rate(self) -> jax.Array:
        """Fraction of assignments dropped (0 when nothing was routed)."""
        return self.dropped / jnp.maximum(self.assignments, 1)


def _combine_stats(layer_stats: list[LayerStats], cfg: ModelConfig) -> MoEStats:
    n_e = max(cfg.n_experts, 1)
    if not layer_stats:
        zero = jnp.zeros((), jnp.float32)
        return MoEStats(zero, zero, zero, jnp.zeros((0, n_e), jnp.float32), jnp.zeros((0,), jnp.float32),
                        jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    aux = jnp.mean(jnp.stack([s.aux_loss for s in layer_stats]))
    z = jnp.mean(jnp.stack([s.router_z_loss for s in layer_stats]))
    weighted = cfg.router_z_loss_coef * z
    if cfg.balance == "aux_loss":
        weighted = weighted + cfg.aux_loss_coef * aux
    return MoEStats(
        aux_loss=aux,
        router_z_loss=z,
        weighted_loss=weighted,
        expert_load=jnp.stack([s.expert_load for s in layer_stats]),
        routing_entropy=jnp.stack([s.routing_entropy for s in layer_stats]),
        dropped=sum((s.dropped for s in layer_stats), jnp.zeros((), jnp.int32)),
        assignments=sum((s.assignments for s in layer_stats), jnp.zeros((), jnp.int32)),
    )


def forward(
    params: Params,
    tokens: jax.Array,
    cfg: ModelConfig,
    *,
    segment_ids: jax.Array | None = None,
    mesh: Mesh | None = None,
    dispatch: str | None = None,
    capacity_factor: float | None | Literal["config"] = "config",
) -> tuple[jax.Array, MoEStats]:
    """Logits float32 [B, S, V] and routing statistics for int32 tokens [B, S] (arguments:
    `hidden_states`)."""
    h, stats = hidden_states(params, tokens, cfg, segment_ids=segment_ids, mesh=mesh, dispatch=dispatch,
                             capacity_factor=capacity_factor)
    # 2-D GEMM
    logits = linear(h, cast(output_head(params, cfg), h.dtype), preferred_element_type=jnp.float32)
    return constrain(logits, ("batch", "seq", "act_vocab"), mesh), stats


def output_head(params: Params, cfg: ModelConfig) -> jax.Array:
    """The output head [D, V] (float32 parameters): lm_head, or the transposed embedding when tied."""
    head: jax.Array = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return head


def hidden_states(
    params: Params,
    tokens: jax.Array,
    cfg: ModelConfig,
    *,
    segment_ids: jax.Array | None = None,
    mesh: Mesh | None = None,
    dispatch: str | None = None,
    capacity_factor: float | None | Literal["config"] = "config",
) -> tuple[jax.Array, MoEStats]:
    """Final-normed hidden states [B, S, D] (compute dtype), the output head's input, and routing statistics.

    segment_ids [B, S]: document ids of a packed batch (attention never crosses documents; negative =
    padding); None means one document per row. mesh: shard activations by the rules table (needed by the EP
    backends). dispatch: backend name (default cfg.dispatch). capacity_factor: "config" uses
    cfg.capacity_factor, None is dropless (what evaluation should use), a float overrides. With a mesh,
    capacity applies per token shard (data * expert groups), without one to the whole batch.
    """
    backend = dispatch or cfg.dispatch
    cf = cfg.capacity_factor if capacity_factor == "config" else capacity_factor
    b, s = tokens.shape
    if segment_ids is None:
        segment_ids = jnp.zeros((b, s), jnp.int32)
    n_groups = 1 if mesh is None else mesh.shape["data"] * mesh.shape["expert"]
    dt = dtype_of(cfg.resolved_compute_dtype())
    positions = segment_positions(segment_ids)
    valid = (segment_ids >= 0).reshape(-1)
    act = ("batch", "seq", "act_embed")

    # Gather the FSDP-sharded embed dim of the table first, so the lookup lands batch-sharded without a
    # reshuffle.
    table = constrain(params["embed"], ("vocab", None), mesh)
    x = constrain(jnp.take(table, tokens, axis=0).astype(jnp.float32), act, mesh)

    def block(lp: Params, x: jax.Array, i: int) -> tuple[jax.Array, LayerStats | None]:
        h = cast(rms_norm(x, lp["attn_norm"], cfg.norm_eps), dt)
        x = x + attention(lp["attn"], h, segment_ids, positions, cfg, is_global=cfg.is_global_layer(i))
        x = constrain(x.astype(jnp.float32), act, mesh)
        h = cast(rms_norm(x, lp["mlp_norm"], cfg.norm_eps), dt)
        st = None
        if "moe" in lp:
            y, st = moe_block(lp["moe"], h.reshape(b * s, -1), valid, cfg, backend=backend,
                              capacity_factor=cf, n_groups=n_groups, mesh=mesh)
            y = y.reshape(b, s, -1)
        else:
            y = swiglu(h, lp["mlp"]["w_gate"], lp["mlp"]["w_up"], lp["mlp"]["w_down"])
        return constrain(x + y.astype(jnp.float32), act, mesh), st

    x, by_layer = run_layers(params["layers"], x, block, cfg)
    layer_stats = [by_layer[i] for i in cfg.moe_layers]

    h = cast(rms_norm(x, params["final_norm"], cfg.norm_eps), dt)
    return h, _combine_stats(layer_stats, cfg)


def update_router_bias(params: Params, expert_load: jax.Array, rate: float | jax.Array) -> Params:
    """One aux-loss-free balancing step (DeepSeek-V3): bias_e += rate * sign(mean load - load_e), per layer.

    expert_load is `MoEStats.expert_load` [n_moe_layers, E] (row j belongs to the j-th MoE layer). Returns a
    new tree; leaves other than `router_bias` are shared, not copied. A model without `router_bias` leaves
    (balance "aux_loss", or no MoE layers) is returned unchanged, so the trainer may call this every step.
    """
    moe_idx = [i for i, lp in enumerate(params["layers"]) if "router_bias" in lp.get("moe", {})]
    if not moe_idx:
        return params
    if expert_load.shape[0] != len(moe_idx):
        raise ValueError(f"expert_load has {expert_load.shape[0]} rows but the model has {len(moe_idx)} MoE "
                         "layers with a router_bias: pass MoEStats.expert_load of this model's forward")
    layers = list(params["layers"])
    for row, i in enumerate(moe_idx):
        load = expert_load[row].astype(jnp.float32)
        bias = layers[i]["moe"]["router_bias"]
        new_bias = bias + rate * jnp.sign(jnp.mean(load) - load)
        layers[i] = {**layers[i], "moe": {**layers[i]["moe"], "router_bias": new_bias}}
    return {**params, "layers": layers}


def _inference_logits(params: Params, tokens: jax.Array, segment_ids: jax.Array | None,
                      cfg: ModelConfig) -> jax.Array:
    backend = "ragged" if cfg.dispatch.startswith("ep_") else cfg.dispatch
    return forward(params, tokens, cfg, segment_ids=segment_ids, dispatch=backend, capacity_factor=None)[0]


_jit_logits = jax.jit(_inference_logits, static_argnums=3)


@dataclass(frozen=True)
class Model:
    """A config plus its parameters: what `load_hf` returns and `save_hf` writes."""

    config: ModelConfig
    params: Params = field(repr=False)

    def logits(self, tokens: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
        """float32 logits [B, S, V] for int tokens [B, S] (jit-compiled once per shape).

        Inference semantics: dropless routing, and the single-device "ragged" backend when the config names an
        expert-parallel one (same values, no mesh needed).
        """
        tok = jnp.asarray(tokens, jnp.int32)
        if tok.ndim != 2:
            raise ValueError(f"Model.logits expects int tokens [batch, seq]; got shape {tok.shape}")
        seg = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
        logits: jax.Array = _jit_logits(self.params, tok, seg, self.config)  # jax.jit's wrapper returns Any
        return logits
