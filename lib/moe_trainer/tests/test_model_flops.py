"""Analytic parameter and FLOP counts: exact against the real parameter tree, and the Marin 535B-A23B
preset."""

from __future__ import annotations

import math
from importlib import resources
from types import SimpleNamespace

import jax
import pytest
import yaml

from moe_trainer import ModelConfig, count_params, flops_per_token, init_params

CONFIGS = {
    "dense": ModelConfig(n_layers=2),
    "moe": ModelConfig(n_experts=8, top_k=2, n_layers=3, first_k_dense=1),
    "rich": ModelConfig(n_experts=8, top_k=3, n_layers=4, moe_every=2, n_shared_experts=2, shared_d_ff=24,
                        latent_dim=16, balance="aux_free", tie_embeddings=True, qk_norm=False),
}


def _preset_model() -> ModelConfig:
    text = resources.files("moe_trainer").joinpath("presets/marin-535b-a23b.yaml").read_text()
    return ModelConfig(**yaml.safe_load(text)["model"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_total_equals_the_parameter_tree(name: str) -> None:
    cfg = CONFIGS[name]
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))  # shapes only, nothing allocated
    assert count_params(cfg)[0] == sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))


def test_active_counts_top_k_routed_experts_and_excludes_embeddings() -> None:
    cfg = CONFIGS["moe"]
    total, active = count_params(cfg)
    routed = 3 * cfg.d_model * cfg.expert_d_ff
    embeddings = 2 * cfg.vocab_size * cfg.d_model
    assert total - active == embeddings + len(cfg.moe_layers) * (cfg.n_experts - cfg.top_k) * routed
    # more experts at the same top_k: total grows, active only by the router
    more = cfg.replace(n_experts=16)
    assert count_params(more)[1] - active == len(cfg.moe_layers) * cfg.d_model * 8
    assert count_params(SimpleNamespace(model=cfg)) == (total, active)


def test_flops_per_token_conventions() -> None:
    cfg = CONFIGS["moe"]
    fwd, bwd = flops_per_token(cfg, 128)
    assert bwd == 2 * fwd
    # routed experts count top_k times: one more expert per token adds 2 * its params per MoE layer
    k3 = flops_per_token(cfg.replace(top_k=3), 128).forward
    assert k3 - fwd == pytest.approx(2 * len(cfg.moe_layers) * 3 * cfg.d_model * cfg.expert_d_ff)
    # causal attention is halved: the attention term grows by 4*H*hd*(S+1)/2 per layer with sequence length
    attn = flops_per_token(cfg, 256).forward - fwd
    assert attn == pytest.approx(cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * (257 - 129) / 2)
    # a sliding window caps the attention term
    windowed = cfg.replace(sliding_window=16)
    assert flops_per_token(windowed, 4096).forward == pytest.approx(flops_per_token(windowed, 8192).forward,
                                                                    rel=1e-3)
    # without attention, forward FLOPs are 2 x (active non-embedding params + output head)
    _, active = count_params(cfg)
    norms_and_gains = cfg.d_model * (1 + 2 * cfg.n_layers) + 2 * cfg.head_dim * cfg.n_layers
    matmul_params = active - norms_and_gains + cfg.d_model * cfg.vocab_size
    attn_1 = cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * 1.0
    assert flops_per_token(cfg, 1).forward == pytest.approx(2 * matmul_params + attn_1)


def test_marin_535b_preset_lands_near_published_counts() -> None:
    """Published (marin #8435, #9277): 535,477,106,688 total, 22.76B active (embedding and head excluded).

    Tolerance 0.5%: features we lack move the count by ~0.1% either way (SConv, GatedNorm and attention gates
    add to Marin's total; its 6-KV-head global layers remove ~0.11B that our 12-head layers keep).
    """
    cfg = _preset_model()
    total, active = count_params(cfg)
    assert total == pytest.approx(535_477_106_688, rel=5e-3)
    assert active == pytest.approx(22.76e9, rel=5e-3)
    # 18T training tokens at seq 4096 give the published ~2.70e24 training FLOPs, to ~3%
    assert flops_per_token(cfg, 4096).total * 18e12 == pytest.approx(2.70e24, rel=3e-2)
