"""Import from and export to the Hugging Face Qwen3-MoE format (`config.json` + safetensors).

On disk the experts are stored per expert, `model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`
([out, in] like every torch Linear), which is what transformers 5 writes and reads (it fuses them into
`gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] in memory only); `load_hf` also accepts the fused keys.

Mapping of the layer schedule: Qwen3-MoE marks dense layers with `mlp_only_layers` (plus
`decoder_sparse_step`); we export our schedule as decoder_sparse_step=1 + the explicit list, and import any HF
schedule that our (first_k_dense, moe_every) rule can express. Aux-loss coefficients differ by a factor top_k
because HF measures expert fractions per token and we per assignment (see moe.py): router_aux_loss_coef =
aux_loss_coef / top_k.

Features Qwen3-MoE cannot express are refused by `save_hf` with the list of offending fields.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moe_trainer.config import ModelConfig
from moe_trainer.layers import Params
from moe_trainer.model import Model

__all__ = ["hf_config_of", "load_hf", "model_config_of_hf", "save_hf", "unrepresentable_fields"]


def unrepresentable_fields(cfg: ModelConfig) -> list[str]:
    """Reasons (one per field) why `cfg` has no Qwen3-MoE equivalent; empty when it exports cleanly."""
    problems = []
    if cfg.n_shared_experts:
        problems.append(f"n_shared_experts={cfg.n_shared_experts} (Qwen3-MoE has no shared experts; use 0)")
    if cfg.latent_dim is not None:
        problems.append(f"latent_dim={cfg.latent_dim} (no latent projection in Qwen3-MoE; use None)")
    if cfg.rope_fraction != 1.0:
        problems.append(f"rope_fraction={cfg.rope_fraction} (Qwen3-MoE rotates full heads; use 1.0)")
    if cfg.nope_every is not None:
        problems.append(f"nope_every={cfg.nope_every} (no NoPE layers in Qwen3-MoE; use None)")
    if cfg.score_fn != "softmax":
        problems.append(f"score_fn={cfg.score_fn!r} (Qwen3-MoE routes with softmax)")
    if cfg.balance == "aux_free":
        problems.append("balance='aux_free' (the per-expert selection bias has no Qwen3-MoE equivalent)")
    if not cfg.qk_norm:
        problems.append("qk_norm=False (Qwen3-MoE always applies q_norm/k_norm)")
    return problems


def hf_config_of(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers `config.json` dict of an exportable ModelConfig."""
    problems = unrepresentable_fields(cfg)
    if problems:
        raise ValueError("this ModelConfig cannot be saved as Qwen3-MoE: " + "; ".join(problems))
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": cfg.sliding_window is not None,
        "sliding_window": cfg.sliding_window,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)],
        "moe_intermediate_size": cfg.expert_d_ff,
        "num_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "norm_topk_prob": cfg.renormalize,
        "router_aux_loss_coef": cfg.aux_loss_coef / cfg.top_k,
        "output_router_logits": False,
        "use_cache": True,
        "dtype": "float32",
    }


def _moe_schedule(n_layers: int, moe_layers: set[int], where: str) -> tuple[int, int]:
    """(first_k_dense, moe_every) reproducing `moe_layers`, or a ValueError naming the layers."""
    if not moe_layers:
        return 0, 1
    for first_k in range(n_layers):
        for every in range(1, n_layers + 1):
            got = {i for i in range(n_layers) if i >= first_k and (i - first_k + 1) % every == 0}
            if got == moe_layers:
                return first_k, every
    raise ValueError(f"{where}: MoE layers {sorted(moe_layers)} of {n_layers} do not follow a 'first k "
                     "dense, "
                     "then every n-th layer' schedule, which is all ModelConfig can express")


def model_config_of_hf(hf: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """ModelConfig of a Qwen3-MoE `config.json` dict; refuses what the model cannot represent."""
    problems = []
    if hf.get("model_type") not in ("qwen3_moe", None):
        problems.append(f"model_type={hf.get('model_type')!r} (only qwen3_moe is supported)")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r} (only silu)")
    if hf.get("attention_bias", False):
        problems.append("attention_bias=true (attention projections have no biases here)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope type {rope.get('rope_type', rope.get('type'))!r} (only default RoPE)")
    if problems:
        raise ValueError(f"{where} cannot be imported: " + "; ".join(problems))
    n_layers = hf["num_hidden_layers"]
    n_experts = hf.get("num_experts", hf.get("num_local_experts", 0)) or 0
    step = hf.get("decoder_sparse_step", 1) or 1
    dense = set(hf.get("mlp_only_layers") or [])
    moe_layers = {i for i in range(n_layers) if n_experts > 0 and i not in dense and (i + 1) % step == 0}
    first_k, every = _moe_schedule(n_layers, moe_layers, where)
    top_k = hf.get("num_experts_per_tok", 2)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=n_layers,
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        qk_norm=True,
        sliding_window=hf.get("sliding_window") if hf.get("use_sliding_window") else None,
        d_ff=hf["intermediate_size"],
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        init_std=float(hf.get("initializer_range", 0.02)),
        max_seq_len=hf.get("max_position_embeddings", 4096),
        n_experts=n_experts if moe_layers else 0,
        moe_every=every,
        first_k_dense=first_k,
        top_k=min(top_k, n_experts) if moe_layers else top_k,
        expert_d_ff=hf.get("moe_intermediate_size", 64),
        renormalize=bool(hf.get("norm_topk_prob", False)),
        aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)) * top_k,
    )


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    from safetensors.flax import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}: expected a Hugging Face model directory")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update({k: np.asarray(v.astype(jnp.float32)) for k, v in load_file(f).items()})
    return tensors


def _params_from_hf(t: dict[str, np.ndarray], cfg: ModelConfig, path: str) -> Params:
    def take(key: str) -> np.ndarray:
        if key not in t:
            raise KeyError(f"{path}: tensor {key!r} is missing from the safetensors files")
        return t.pop(key)

    h, kv, hd, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    layers = []
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        attn = {
            "wq": take(pre + "self_attn.q_proj.weight").T.reshape(d, h, hd),
            "wk": take(pre + "self_attn.k_proj.weight").T.reshape(d, kv, hd),
            "wv": take(pre + "self_attn.v_proj.weight").T.reshape(d, kv, hd),
            "wo": take(pre + "self_attn.o_proj.weight").T.reshape(h, hd, d),
            "q_norm": take(pre + "self_attn.q_norm.weight"),
            "k_norm": take(pre + "self_attn.k_norm.weight"),
        }
        layer: Params = {"attn_norm": take(pre + "input_layernorm.weight"), "attn": attn,
                         "mlp_norm": take(pre + "post_attention_layernorm.weight")}
        if cfg.is_moe_layer(i):
            ex = pre + "mlp.experts."
            if ex + "gate_up_proj" in t:  # fused transformers-5 in-memory layout
                gate_up, down = take(ex + "gate_up_proj"), take(ex + "down_proj")
                f = cfg.expert_d_ff
                w_gate, w_up = gate_up[:, :f].transpose(0, 2, 1), gate_up[:, f:].transpose(0, 2, 1)
                w_down = down.transpose(0, 2, 1)
            else:
                rng = range(cfg.n_experts)
                w_gate = np.stack([take(f"{ex}{e}.gate_proj.weight").T for e in rng])
                w_up = np.stack([take(f"{ex}{e}.up_proj.weight").T for e in rng])
                w_down = np.stack([take(f"{ex}{e}.down_proj.weight").T for e in rng])
            layer["moe"] = {"router": take(pre + "mlp.gate.weight").T, "w_gate": w_gate, "w_up": w_up,
                            "w_down": w_down}
        else:
            layer["mlp"] = {"w_gate": take(pre + "mlp.gate_proj.weight").T,
                            "w_up": take(pre + "mlp.up_proj.weight").T,
                            "w_down": take(pre + "mlp.down_proj.weight").T}
        layers.append(layer)
    params: Params = {"embed": take("model.embed_tokens.weight"), "layers": layers,
                      "final_norm": take("model.norm.weight")}
    if cfg.tie_embeddings:
        t.pop("lm_head.weight", None)
    else:
        params["lm_head"] = take("lm_head.weight").T
    if t:
        raise ValueError(f"{path}: tensors with no place in the model: {sorted(t)[:8]} (is this Qwen3-MoE?)")
    # tree_map is typed Any; it returns the same tree with every numpy leaf as a float32 jax array
    out: Params = jax.tree_util.tree_map(lambda a: jnp.asarray(np.ascontiguousarray(a), jnp.float32), params)
    return out


def load_hf(path: str) -> Model:
    """A Model (config + float32 parameters) from a Hugging Face Qwen3-MoE directory."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{cfg_path} not found: load_hf expects a Hugging Face model directory")
    with open(cfg_path) as f:
        cfg = model_config_of_hf(json.load(f), where=cfg_path)
    return Model(cfg, _params_from_hf(_read_tensors(path), cfg, path))


def _hf_tensors(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    def np32(a: jax.Array) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a, dtype=np.float32))

    h, kv, hd, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    out: dict[str, np.ndarray] = {"model.embed_tokens.weight": np32(params["embed"]),
                                  "model.norm.weight": np32(params["final_norm"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = np32(params["lm_head"]).T
    for i, lp in enumerate(params["layers"]):
        pre = f"model.layers.{i}."
        a = lp["attn"]
        out[pre + "self_attn.q_proj.weight"] = np32(a["wq"]).reshape(d, h * hd).T
        out[pre + "self_attn.k_proj.weight"] = np32(a["wk"]).reshape(d, kv * hd).T
        out[pre + "self_attn.v_proj.weight"] = np32(a["wv"]).reshape(d, kv * hd).T
        out[pre + "self_attn.o_proj.weight"] = np32(a["wo"]).reshape(h * hd, d).T
        out[pre + "self_attn.q_norm.weight"] = np32(a["q_norm"])
        out[pre + "self_attn.k_norm.weight"] = np32(a["k_norm"])
        out[pre + "input_layernorm.weight"] = np32(lp["attn_norm"])
        out[pre + "post_attention_layernorm.weight"] = np32(lp["mlp_norm"])
        if "moe" in lp:
            m = lp["moe"]
            out[pre + "mlp.gate.weight"] = np32(m["router"]).T
            for e in range(cfg.n_experts):
                out[f"{pre}mlp.experts.{e}.gate_proj.weight"] = np32(m["w_gate"][e]).T
                out[f"{pre}mlp.experts.{e}.up_proj.weight"] = np32(m["w_up"][e]).T
                out[f"{pre}mlp.experts.{e}.down_proj.weight"] = np32(m["w_down"][e]).T
        else:
            for name in ("gate", "up", "down"):
                out[f"{pre}mlp.{name}_proj.weight"] = np32(lp["mlp"][f"w_{name}"]).T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def save_hf(model: Model, path: str) -> None:
    """Write `model` as a Qwen3-MoE directory (config.json + model.safetensors, float32) transformers
    loads."""
    from safetensors.numpy import save_file

    hf_cfg = hf_config_of(model.config)
    os.makedirs(path, exist_ok=True)
    save_file(_hf_tensors(model.params, model.config), os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
