"""Golden parity with transformers' Qwen3MoeForCausalLM (tiny random models built offline, float32)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # the test extra installs torch (CPU) and transformers: no silent skip when they are missing
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from moe_trainer import ModelConfig, forward
from moe_trainer.hf import hf_config_of, load_hf, save_hf

HF_CONFIGS = {
    # first layer dense, softmax top-2 renormalised, untied head, full attention
    "renorm": dict(mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=True,
                   tie_word_embeddings=False),
    # every 2nd layer MoE, no renormalisation, tied embeddings, sliding window on every layer
    "window_tied": dict(mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=False,
                        tie_word_embeddings=True,
                        use_sliding_window=True, sliding_window=5),
}


def _build_hf(tmp: Path, variant: str) -> tuple[object, Path]:
    cfg = Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16,
                         num_experts=8, num_experts_per_tok=2, rope_theta=10000.0, max_position_embeddings=64,
                         attn_implementation="eager", **HF_CONFIGS[variant])
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains and larger weights so every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp / f"hf-{variant}"
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def hf_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("hf")
    model, path = _build_hf(tmp, request.param)
    tokens = np.random.default_rng(1).integers(0, 96, size=(2, 12)).astype(np.int64)
    with torch.no_grad():
        out = model(torch.from_numpy(tokens), output_router_logits=True)
    return model, path, tokens, out, tmp


def _per_token_ce(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    lg = logits[:, :-1].astype(np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    return lse - np.take_along_axis(lg, tokens[:, 1:, None], axis=-1)[..., 0]


def test_load_hf_matches_transformers(hf_pair: tuple) -> None:
    _, path, tokens, out, _ = hf_pair
    model = load_hf(str(path))
    ours = np.asarray(model.logits(tokens))
    theirs = out.logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_per_token_ce(ours, tokens), _per_token_ce(theirs, tokens), rtol=1e-4,
                               atol=1e-4)


def test_aux_loss_matches_hf_load_balancing_loss(hf_pair: tuple) -> None:
    """Ours measures expert fractions per assignment, HF per token: HF = top_k * ours, per layer."""
    _, path, tokens, out, _ = hf_pair
    model = load_hf(str(path))
    _, stats = jax.jit(lambda p, t: forward(p, t, model.config))(model.params, jnp.asarray(tokens, jnp.int32))
    per_layer = [float(load_balancing_loss_func((lg,), 8, 2)) for lg in out.router_logits]
    assert len(per_layer) == len(model.config.moe_layers) == stats.expert_load.shape[0]
    np.testing.assert_allclose(float(stats.aux_loss) * 2, np.mean(per_layer), rtol=1e-5)


def test_save_hf_loads_in_transformers(hf_pair: tuple) -> None:
    _, path, tokens, out, tmp = hf_pair
    model = load_hf(str(path))
    export = tmp / "export"
    save_hf(model, str(export))
    reloaded = Qwen3MoeForCausalLM.from_pretrained(export, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = reloaded(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, out.logits.numpy(), rtol=1e-4, atol=1e-4)
    again = load_hf(str(export))
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((export / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_save_hf_refuses_unrepresentable_configs() -> None:
    cfg = ModelConfig(n_experts=4, n_shared_experts=1, latent_dim=16, rope_fraction=0.5, nope_every=2,
                      score_fn="sigmoid", balance="aux_free")
    with pytest.raises(ValueError) as err:
        hf_config_of(cfg)
    for field in ("n_shared_experts", "latent_dim", "rope_fraction", "nope_every", "score_fn", "balance"):
        assert field in str(err.value)
