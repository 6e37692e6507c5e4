"""The parameter tree: `init_params` builds it, `param_logical_axes` names every axis of every leaf.

Layout (all float32; matrices are stored [in, out] so activations multiply on the left):
```
embed            [vocab, embed]
layers[i]        attn_norm [embed]; attn {wq [embed, heads, head_dim], wk/wv [embed, kv_heads, head_dim],
                 wo [heads, head_dim, embed], q_norm/k_norm [head_dim]}; mlp_norm [embed];
                 dense layers: mlp {w_gate/w_up [embed, mlp], w_down [mlp, embed]}
                 MoE layers:   moe {router [embed, experts], router_bias [experts] (aux_free only),
                                    w_gate/w_up [experts, expert_embed, expert_mlp], w_down [experts,
                                    expert_mlp, expert_embed], shared {w_gate/w_up [embed, mlp], w_down [mlp,
                                    embed]}, latent_down [embed, latent], latent_norm [latent], latent_up
                                    [latent, embed]}
final_norm       [embed]
lm_head          [embed, vocab] (absent when tie_embeddings)
```
`router_bias` is a statistic updated by `update_router_bias`, not by gradients: optimizers must leave it
alone.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from moe_trainer.attention import init_attention
from moe_trainer.config import ModelConfig
from moe_trainer.layers import Params, init_swiglu, normal
from moe_trainer.moe import init_moe

Axes = tuple[str, ...]


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Freshly initialised float32 parameters for `cfg` (see the module docstring for the tree)."""
    k_embed, k_head, k_layers = jax.random.split(key, 3)
    layers = []
    for i, k in enumerate(jax.random.split(k_layers, cfg.n_layers)):
        ka, km = jax.random.split(k)
        layer: Params = {
            "attn_norm": jnp.ones((cfg.d_model,), jnp.float32),
            "attn": init_attention(ka, cfg),
            "mlp_norm": jnp.ones((cfg.d_model,), jnp.float32),
        }
        if cfg.is_moe_layer(i):
            layer["moe"] = init_moe(km, cfg)
        else:
            layer["mlp"] = init_swiglu(km, cfg.d_model, cfg.d_ff, cfg.init_std)
        layers.append(layer)
    params: Params = {
        "embed": normal(k_embed, (cfg.vocab_size, cfg.d_model), cfg.init_std),
        "layers": layers,
        "final_norm": jnp.ones((cfg.d_model,), jnp.float32),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = normal(k_head, (cfg.d_model, cfg.vocab_size), cfg.init_std)
    return params


def _mlp_axes() -> dict[str, Axes]:
    return {"w_gate": ("embed", "mlp"), "w_up": ("embed", "mlp"), "w_down": ("mlp", "embed")}


def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """A tree matching `init_params(cfg, key)` whose leaves are tuples of logical axis names, one per dim."""
    layers = []
    for i in range(cfg.n_layers):
        attn: dict[str, Axes] = {
            "wq": ("embed", "heads", "head_dim"),
            "wk": ("embed", "kv_heads", "head_dim"),
            "wv": ("embed", "kv_heads", "head_dim"),
            "wo": ("heads", "head_dim", "embed"),
        }
        if cfg.qk_norm:
            attn["q_norm"] = ("head_dim",)
            attn["k_norm"] = ("head_dim",)
        layer: dict[str, object] = {"attn_norm": ("norm",), "attn": attn, "mlp_norm": ("norm",)}
        if cfg.is_moe_layer(i):
            moe: dict[str, Axes | dict[str, Axes]] = {
                "router": ("embed", "experts_router"),
                "w_gate": ("experts", "expert_embed", "expert_mlp"),
                "w_up": ("experts", "expert_embed", "expert_mlp"),
                "w_down": ("experts", "expert_mlp", "expert_embed"),
            }
            if cfg.balance == "aux_free":
                moe["router_bias"] = ("experts_router",)
            if cfg.n_shared_experts:
                moe["shared"] = _mlp_axes()
            if cfg.latent_dim is not None:
                moe["latent_down"] = ("embed", "latent")
                moe["latent_norm"] = ("norm",)
                moe["latent_up"] = ("latent", "embed")
            layer["moe"] = moe
        else:
            layer["mlp"] = _mlp_axes()
        layers.append(layer)
    axes: dict[str, object] = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("norm",)}
    if not cfg.tie_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def is_axes_leaf(x: object) -> bool:
    """tree_util leaf predicate for the axes tree (tuples of strings are leaves, not nodes)."""
    return isinstance(x, tuple) and all(isinstance(a, str) for a in x)
