"""The mesh and the compiled train step of one training configuration.

``train`` asks this module for three things before its loop starts: the device mesh of ``MeshConfig``
(``build_mesh``), the shardings of the whole train state on it (``state_shardings``: parameters by the
rules table of ``sharding.py``, each optimizer-state leaf like the parameter it shadows, counters
replicated) and the jitted init and step functions (``compile_train_step``). What the compiled step depends
on is one hashable ``StepSpec`` (``StepSpec.of(train_config)``): the executables are cached per spec and
mesh, so repeated ``train`` calls in one process — resumes, tests, benchmarks — reuse one executable.

XLA compiler options are chosen here too, per platform and model (``compiler_options``), because they apply
to the train step's ``jax.jit`` only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from moe_trainer import optim
from moe_trainer.config import ModelConfig
from moe_trainer.health import HealthConfig
from moe_trainer.jax_typed import P
from moe_trainer.loss import make_lm_loss, make_router_bias_update
from moe_trainer.model import init_params, param_logical_axes
from moe_trainer.sharding import logical_to_spec, make_mesh, param_shardings
from moe_trainer.state import TrainState
from moe_trainer.step import init_state, make_train_step
from moe_trainer.train_config import MeshConfig, TrainConfig


def build_mesh(cfg: MeshConfig) -> Mesh:
    n = jax.device_count()
    data = cfg.data if cfg.data > 0 else n // (cfg.expert * cfg.model)
    if data < 1:
        raise ValueError(
            f"mesh expert={cfg.expert} x model={cfg.model} needs more than the {n} devices JAX sees"
        )
    return make_mesh(data=data, expert=cfg.expert, model=cfg.model)


def _path_names(tree: Any) -> list[tuple[str, Any]]:
    return [(optim._path_name(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def state_shardings(abstract_state: TrainState, param_sh: Any, mesh: Mesh) -> TrainState:
    """Shardings of the whole train state: parameters by the rules table; each optimizer-state leaf like the
    parameter it shadows (matched by path suffix and shape); counters and windows replicated."""
    replicated = NamedSharding(mesh, P())
    params_by_name = {
        name: (leaf.shape, sh)
        for (name, leaf), (_, sh) in zip(
            _path_names(abstract_state.params), _path_names(param_sh), strict=True
        )
    }

    def opt_leaf(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
        name = optim._path_name(path)
        best: tuple[int, NamedSharding] = (-1, replicated)
        for pname, (shape, sh) in params_by_name.items():
            if (
                (name == pname or name.endswith("/" + pname))
                and tuple(leaf.shape) == tuple(shape)
                and len(pname) > best[0]
            ):
                best = (len(pname), sh)
        return best[1]

    everything_replicated: TrainState = jax.tree.map(lambda _: replicated, abstract_state)
    return dataclasses.replace(
        everything_replicated,
        params=param_sh,
        opt_state=jax.tree_util.tree_map_with_path(opt_leaf, abstract_state.opt_state),
    )


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted train step and init of one configuration, with the state's shape and shardings."""

    step: Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]
    """``(state, global batch) -> (state, metrics)``, jitted with the state donated."""
    init: Callable[[], TrainState]
    """A fresh initial state, placed on ``shardings``."""
    abstract_state: TrainState
    """The state's shapes and dtypes (``jax.ShapeDtypeStruct`` leaves)."""
    shardings: TrainState
    """Where each leaf of the state lives on the mesh."""
    batch_sharding: NamedSharding


# XLA:CPU options of the train step. By default XLA:CPU (jax 0.10) hands dots and some reductions to YNNPACK
# fusions. At the MoE presets' shapes (small batched expert GEMMs, [tokens, d] x [d, vocab] head chunks) XLA's
# own Eigen GEMMs ran them ~1.3-2x faster (docs/benchmarks/trainer.md); at the dense llama_nano shape of
# Levanter's tutorial (d 32) XLA's defaults were faster (docs/benchmarks/trainer-accel.md). So the choice is
# per model.
CPU_COMPILER_OPTIONS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": ""}
"""The options that turn YNNPACK fusions off (what `compiler_options` returns when it picks "off")."""


def compiler_options(mesh: Mesh, model: ModelConfig | None = None) -> dict[str, str] | None:
    """XLA compiler options for the train step of `model` on `mesh`'s platform (None: XLA's defaults).

    CPU: YNNPACK fusions off for models with MoE layers (measured faster at the tiny preset), XLA's defaults
    for dense models (measured faster at llama_nano; docs/benchmarks/trainer-accel.md). Other platforms:
    XLA's defaults.
    """
    if mesh.devices.flat[0].platform != "cpu":
        return None
    if model is not None and not model.moe_layers:
        return None
    return dict(CPU_COMPILER_OPTIONS)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything the compiled train step depends on, hashable (the compile cache's key).

    A ``TrainConfig`` is not hashable (its data config holds dicts) and most of it (paths, intervals, W&B)
    does not change the step; ``StepSpec.of`` takes the parts that do.
    """

    model: ModelConfig
    optimizer: optim.OptimizerConfig
    schedule: optim.ScheduleConfig
    health: HealthConfig
    accum_steps: int
    num_steps: int
    """The schedule's length."""
    seed: int
    """The parameter-initialisation seed of ``Compiled.init``."""
    batch_shape: tuple[int, int]
    """(global batch size, sequence length)."""

    @classmethod
    def of(cls, config: TrainConfig) -> StepSpec:
        return cls(config.model, config.optimizer, config.schedule, config.health, config.accum_steps,
                   config.num_steps, config.seed, (config.data.batch_size, config.data.seq_len))


def compile_train_step(
    spec: StepSpec, mesh: Mesh, xla_options: tuple[tuple[str, str], ...] | None = None
) -> Compiled:
    """The jitted init and train step of ``spec`` on ``mesh``, cached so repeated ``train`` calls — resumes,
    tests — reuse the compiled executable (``clear_compiled`` empties the cache). ``xla_options`` replaces the
    choice of `compiler_options` (benchmarks compare both; ``()`` is XLA's defaults)."""
    return _compile(spec, mesh, xla_options)


def clear_compiled() -> None:
    """Forget every cached executable (benchmarks time compilation with it)."""
    _compile.cache_clear()


@functools.lru_cache(maxsize=8)
def _compile(spec: StepSpec, mesh: Mesh, xla_options: tuple[tuple[str, str], ...] | None) -> Compiled:
    model, opt, health, seed = spec.model, spec.optimizer, spec.health, spec.seed
    abstract_params = jax.eval_shape(lambda: init_params(model, jax.random.key(seed)))
    optimizer = optim.build_optimizer(opt, abstract_params, param_logical_axes(model))
    schedule = optim.make_schedule(spec.schedule, spec.num_steps)
    loss_fn = make_lm_loss(model, mesh=mesh)
    step_fn = make_train_step(
        loss_fn,
        optimizer,
        schedule,
        health,
        spec.accum_steps,
        make_router_bias_update(model, opt.router_bias_rate),
    )

    def init() -> TrainState:
        return init_state(init_params(model, jax.random.key(seed)), optimizer, health, seed)

    abstract = jax.eval_shape(init)
    shardings = state_shardings(abstract, param_shardings(model, mesh), mesh)
    batch_sharding = NamedSharding(mesh, logical_to_spec(("batch", "seq"), spec.batch_shape, mesh))
    options = compiler_options(mesh, model) if xla_options is None else dict(xla_options)
    # metrics replicated: every process of a multi-host run can read them (they are a few scalars and vectors)
    jit_step = jax.jit(
        step_fn,
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, NamedSharding(mesh, P())),
        donate_argnums=0,
        compiler_options=options,
    )
    return Compiled(jit_step, jax.jit(init, out_shardings=shardings), abstract, shardings, batch_sharding)
