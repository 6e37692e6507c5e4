"""moe_trainer: a JAX Mixture-of-Experts language-model trainer (model, sharding, HF interop, training).

Reading order: config.py -> layers.py -> attention.py -> dispatch.py / dispatch_ep.py -> moe.py -> params.py
-> sharding.py -> model.py -> flops.py -> hf.py.
"""

from moe_trainer.config import ModelConfig
from moe_trainer.model import Model, MoEStats, forward, init_params, param_logical_axes, update_router_bias
from moe_trainer.sharding import make_mesh, param_shardings, shard_params

__all__ = [
    "Model",
    "ModelConfig",
    "MoEStats",
    "forward",
    "init_params",
    "make_mesh",
    "param_logical_axes",
    "param_shardings",
    "shard_params",
    "update_router_bias",
]
