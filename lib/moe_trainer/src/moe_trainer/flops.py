"""Analytic parameter and FLOP counts (pure arithmetic on the config: nothing is allocated or traced).

Parameter convention:
- total: every leaf of `init_params`, i.e. embedding, output head (once if tied), attention, norms and QK-norm
  gains, dense MLPs, routers (and the aux-free `router_bias`), all routed experts, shared experts, latent
  projections. `tests/test_model_flops.py` checks this equals the size of the real parameter tree.
- active: the parameters one token actually multiplies, *excluding the embedding table and the output head*
  (the convention of Marin's published "535B-A23B": 22.76B counts neither): attention, norms, dense MLPs,
  routers, shared experts, latent projections and top_k of the routed experts per MoE layer.

FLOP convention (model FLOPs, as MFU wants): 2 FLOPs per multiply-add of every matmul one token goes through,
including the router, the latent projections, shared experts, top_k routed experts (each counted once per
assignment, so k times) and the output head; the embedding lookup is free. Attention scores and the weighted
sum cost 4 * n_heads * head_dim FLOPs per visible key, and a query sees on average (S+1)/2 keys under a causal
mask (the "halved" attention) or, with a sliding window w < S, (w(w+1)/2 + (S-w)w)/S keys. Backward = 2 x
forward (no remat counted). Capacity drops are ignored: the count is the dropless work.
"""

from __future__ import annotations

from typing import NamedTuple

from moe_trainer.config import ModelConfig


class FlopsPerToken(NamedTuple):
    """Training FLOPs per token: unpack as `fwd, bwd = flops_per_token(cfg, seq_len)`."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        """forward + backward: the model FLOPs of one training token (what MFU divides)."""
        return self.forward + self.backward


def _model_config(config: object) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    inner = getattr(config, "model", None)
    if isinstance(inner, ModelConfig):
        return inner
    raise TypeError("expected a ModelConfig or a config with a .model ModelConfig, got "
                    f"{type(config).__name__}")


def _attention_params(c: ModelConfig) -> int:
    proj = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
    return proj + (2 * c.head_dim if c.qk_norm else 0)


def _expert_params(c: ModelConfig) -> int:
    """One routed expert."""
    return 3 * c.moe_dim * c.expert_d_ff


def _moe_params(c: ModelConfig, experts: int) -> int:
    """One MoE layer, counting `experts` routed experts."""
    n = c.d_model * c.n_experts + experts * _expert_params(c) + 3 * c.d_model * c.shared_width
    if c.balance == "aux_free":
        n += c.n_experts
    if c.latent_dim is not None:
        n += 2 * c.d_model * c.latent_dim + c.latent_dim
    return n


def count_params(config: object) -> tuple[int, int]:
    """(total, active) parameter counts of a ModelConfig (or of `config.model`); see the module docstring."""
    c = _model_config(config)
    embed = c.vocab_size * c.d_model
    head = 0 if c.tie_embeddings else c.d_model * c.vocab_size
    total = embed + head + c.d_model  # + final norm
    active = c.d_model
    for i in range(c.n_layers):
        common = _attention_params(c) + 2 * c.d_model
        if c.is_moe_layer(i):
            total += common + _moe_params(c, c.n_experts)
            active += common + _moe_params(c, c.top_k)
        else:
            total += common + 3 * c.d_model * c.d_ff
            active += common + 3 * c.d_model * c.d_ff
    return total, active


def visible_keys(seq_len: int, window: int | None) -> float:
    """Mean number of keys a query attends to under a causal mask with an optional sliding window."""
    w = seq_len if window is None else min(window, seq_len)
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def flops_per_token(config: object, seq_len: int) -> FlopsPerToken:
    """Forward and backward model FLOPs per token at sequence length `seq_len` (see the module docstring)."""
    c = _model_config(config)
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be a positive number of tokens")
    macs = c.d_model * c.vocab_size  # output head (counted even when tied)
    attn = 0.0
    for i in range(c.n_layers):
        macs += c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
        if c.is_moe_layer(i):
            macs += c.d_model * c.n_experts + c.top_k * _expert_params(c) + 3 * c.d_model * c.shared_width
            if c.latent_dim is not None:
                macs += 2 * c.d_model * c.latent_dim
        else:
            macs += 3 * c.d_model * c.d_ff
        window = None if c.is_global_layer(i) else c.sliding_window
        attn += 4 * c.n_heads * c.head_dim * visible_keys(seq_len, window)
    forward = 2.0 * macs + attn
    return FlopsPerToken(forward=forward, backward=2.0 * forward)
