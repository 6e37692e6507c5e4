"""moe_trainer: a JAX Mixture-of-Experts language-model trainer (model, sharding, HF interop, training).

Reading order (every module): config.py -> layers.py -> attention.py -> expert_slots.py -> dispatch_local.py
-> dispatch.py / dispatch_ep.py -> moe.py -> params.py -> layer_stack.py -> sharding.py -> model.py ->
flops.py -> hf.py; then training: optim.py (optim_marin.py, hparams.py) -> health.py -> state.py -> step.py ->
chunked_loss.py -> loss.py -> checkpoint.py -> warm_start.py -> distributed.py -> metrics.py -> evaluate.py ->
health_rules.py -> watch.py -> progress.py -> train_config.py -> compiled.py -> batch_source.py -> resume.py
-> train.py. Beside the path: data/ (the token cache, the Feistel permutation, the loaders, mixtures, the
shuffle gates), presets/ (the YAML presets), jsonio.py (the one JSON write/read), jsonl.py (JSONL appends) and
jax_typed.py (typed views of jax's unannotated entry points).

The public API for notebooks and tools: ``load_preset``, ``count_params``, ``load_hf``, ``save_hf``,
``load_checkpoint``, ``feistel_permutation``, ``train``, ``TrainConfig`` (plus the model building blocks).
"""

from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.config import ModelConfig
from moe_trainer.data.permutation import feistel_permutation
from moe_trainer.evaluate import evaluate
from moe_trainer.flops import FlopsPerToken, count_params, flops_per_token
from moe_trainer.hf import load_hf, save_hf
from moe_trainer.model import Model, MoEStats, forward, init_params, param_logical_axes, update_router_bias
from moe_trainer.presets import load_preset, preset_names
from moe_trainer.sharding import make_mesh, param_shardings, shard_params
from moe_trainer.train import train
from moe_trainer.train_config import TrainConfig, TrainResult

__all__ = [
    "FlopsPerToken",
    "Model",
    "ModelConfig",
    "MoEStats",
    "TrainConfig",
    "TrainResult",
    "count_params",
    "evaluate",
    "feistel_permutation",
    "flops_per_token",
    "forward",
    "init_params",
    "load_checkpoint",
    "load_hf",
    "load_preset",
    "make_mesh",
    "param_logical_axes",
    "param_shardings",
    "preset_names",
    "save_hf",
    "shard_params",
    "train",
    "update_router_bias",
]
