"""The MoE layer: float32 router, load-balancing statistics, dispatch, shared experts and the latent
projection.

Router: logits = x W_router in float32; scores = softmax(logits) or sigmoid(logits). Experts are selected by
top-k of the scores (plus, with balance="aux_free", a per-expert bias that only affects the selection, as in
DeepSeek-V3); combine weights are the unbiased scores of the chosen experts, renormalised to sum to 1 when
`renormalize` is on.

Statistics (per layer, over valid tokens; combined across layers by the model):
- aux_loss = E * sum_e f_e * P_e with f_e the fraction of the T*k assignments that chose expert e and P_e the
  mean router probability of e (sigmoid scores are normalised per token first). Balanced routing gives 1.0.
  Hugging Face's `load_balancing_loss_func` measures f_e per token instead of per assignment, i.e. k times
  this.
- router_z_loss = mean(logsumexp(logits)^2).
- expert_load = f_e (routing decisions before any capacity drop), routing_entropy = mean per-token entropy of
  the (normalised) router probabilities, dropped / assignments = counts of valid assignments.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from moe_trainer.config import ModelConfig
from moe_trainer.dispatch import run_dispatch
from moe_trainer.layers import Params, cast, init_swiglu, normal, rms_norm, swiglu


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LayerStats:
    """Routing statistics of one MoE layer (see the module docstring)."""

    aux_loss: jax.Array
    router_z_loss: jax.Array
    expert_load: jax.Array
    routing_entropy: jax.Array
    dropped: jax.Array
    assignments: jax.Array


def init_moe(key: jax.Array, cfg: ModelConfig) -> Params:
    """Parameters of one MoE layer; expert weights are stacked on a leading experts axis."""
    kr, kg, ku, kd, ks, kl1, kl2 = jax.random.split(key, 7)
    e, m, f, std = cfg.n_experts, cfg.moe_dim, cfg.expert_d_ff, cfg.init_std
    p: Params = {
        "router": normal(kr, (cfg.d_model, e), std),
        "w_gate": normal(kg, (e, m, f), std),
        "w_up": normal(ku, (e, m, f), std),
        "w_down": normal(kd, (e, f, m), std),
    }
    if cfg.balance == "aux_free":
        p["router_bias"] = jnp.zeros((e,), jnp.float32)
    if cfg.n_shared_experts:
        p["shared"] = init_swiglu(ks, cfg.d_model, cfg.shared_width, std)
    if cfg.latent_dim is not None:
        p["latent_down"] = normal(kl1, (cfg.d_model, cfg.latent_dim), std)
        p["latent_norm"] = jnp.ones((cfg.latent_dim,), jnp.float32)
        p["latent_up"] = normal(kl2, (cfg.latent_dim, cfg.d_model), std)
    return p


def route(
    p: Params, x: jax.Array, valid: jax.Array, cfg: ModelConfig
) -> tuple[jax.Array, jax.Array, LayerStats]:
    """Router of x [T, D]: (expert_ids int32 [T, k], combine weights float32 [T, k], stats without drops)."""
    logits = x.astype(jnp.float32) @ p["router"].astype(jnp.float32)  # (T, E)
    if cfg.score_fn == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
        probs = scores
    else:
        scores = jax.nn.sigmoid(logits)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    select = scores
    if "router_bias" in p:  # aux-free balancing: the bias steers selection only, never the weights or grads
        select = scores + jax.lax.stop_gradient(p["router_bias"])
    _, ids = jax.lax.top_k(select, cfg.top_k)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if cfg.renormalize:
        weights = weights / jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), 1e-20)

    vf = valid.astype(jnp.float32)
    n_valid = jnp.maximum(jnp.sum(vf), 1.0)
    counts = jnp.zeros((cfg.n_experts,), jnp.float32).at[ids].add(jnp.broadcast_to(vf[:, None], ids.shape))
    load = counts / (n_valid * cfg.top_k)
    mean_prob = jnp.sum(probs * vf[:, None], axis=0) / n_valid
    aux = cfg.n_experts * jnp.sum(jax.lax.stop_gradient(load) * mean_prob)
    z = jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1)) * vf) / n_valid
    ent = -jnp.sum(jnp.where(probs > 0, probs * jnp.log(jnp.maximum(probs, 1e-30)), 0.0), axis=-1)
    stats = LayerStats(
        aux_loss=aux,
        router_z_loss=z,
        expert_load=jax.lax.stop_gradient(load),
        routing_entropy=jax.lax.stop_gradient(jnp.sum(ent * vf) / n_valid),
        dropped=jnp.zeros((), jnp.int32),
        assignments=jnp.sum(valid, dtype=jnp.int32) * cfg.top_k,
    )
    return ids.astype(jnp.int32), weights, stats


def moe_block(
    p: Params,
    x: jax.Array,
    valid: jax.Array,
    cfg: ModelConfig,
    *,
    backend: str,
    capacity_factor: float | None,
    n_groups: int,
    mesh: Mesh | None,
) -> tuple[jax.Array, LayerStats]:
    """MoE MLP of normalised tokens x [T, D] (compute dtype) -> ([T, D], stats)."""
    ids, weights, stats = route(p, x, valid, cfg)
    h = x
    if cfg.latent_dim is not None:  # only the routed path goes through the latent space
        h = rms_norm(x @ cast(p["latent_down"], x.dtype), p["latent_norm"], cfg.norm_eps)
    capacity = None if capacity_factor is None else cfg.capacity(x.shape[0] // n_groups, capacity_factor)
    experts = {k: p[k] for k in ("w_gate", "w_up", "w_down")}
    routed, dropped = run_dispatch(
        backend, h, ids, weights, valid, experts, capacity=capacity, n_groups=n_groups, mesh=mesh,
        matmul=cfg.grouped_matmul,
    )
    if cfg.latent_dim is not None:
        routed = routed @ cast(p["latent_up"], x.dtype)
    out = routed
    if cfg.n_shared_experts:
        sp = p["shared"]
        out = out + swiglu(x, sp["w_gate"], sp["w_up"], sp["w_down"])
    stats = LayerStats(stats.aux_loss, stats.router_z_loss, stats.expert_load, stats.routing_entropy,
                       dropped, stats.assignments)
    return out, stats
