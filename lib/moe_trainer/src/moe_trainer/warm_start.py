"""Warm start: begin a run from the parameters of another run's checkpoint (or a Hugging Face directory) whose
architecture may differ, as Marin rescued its 32B run by moving to the Qwen3 backbone (QK-norm) from the
step-80K Llama weights.

The mapping works on parameter *paths* ("layers/0/attn/wq") and shapes, never on a particular layout, so a
model whose layers are stacked maps the same way as one with a list of layers. For every parameter of the new
model, in this order:

1. **copied**: the source has the same path (after the optional ``rename`` regexes) and the same shape.
2. **grown**: same path, and the shapes differ only along an experts axis (logical axis ``experts`` or
   ``experts_router`` of ``param_logical_axes``) that got longer: the first E_src entries are the source's;
   new expert e takes source expert ``e mod E_src`` (its router column too) times ``1 + expert_noise * N(0,
   1)`` with ``new_experts="copy"`` (the noise breaks the tie between a copy and its original), or the fresh
   initialisation with ``new_experts="init"``; a ``router_bias`` grows with zeros.
3. **new** (absent from the source): RMSNorm gains, QK-norm's ``q_norm``/``k_norm`` included, are **ones**
   (the norm starts as plain RMS normalisation); ``router_bias`` is **zero**; anything else keeps the new
   run's own initialisation (``init_params`` with the run's seed).
4. Any other shape difference cannot be resolved: a ``ValueError`` names the parameter, both shapes and the
   ways out (``rename``, or the config field to match).

Source parameters the new model has no place for are **dropped**; all four lists are written to
``warm_start.json`` in the run directory. The optimizer state is ``reset`` (a fresh ``optimizer.init``, the
default) or ``carry``: each leaf whose path and shape the source's optimizer state also has is copied (so
moments of copied parameters carry over; new, grown or differently-grouped ones start at zero). The step
counter always restarts at 0 and the health windows are always fresh (a warm start moves the loss on purpose;
carried windows would read the jump as a spike and skip it). ``data_position`` is ``reset`` (0) or ``carry``
(continue the source run's data stream).

A run with ``init_from`` warm-starts only when its own checkpoint directory is empty: once it has saved a
checkpoint, a restart resumes from that, as any run does. ``init_from`` and these options are fields of the
train config, so they are part of the step's identity.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Literal

import jax
import numpy as np

from moe_trainer.config import ModelConfig
from moe_trainer.state import TrainState

PyTree = Any
_EXPERT_AXES = ("experts", "experts_router")


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """How a run is initialised from ``TrainConfig.init_from`` (another architecture's weights)."""

    step: int | None = None
    """Checkpoint step to read (None: the newest complete one, or the step of a step directory)."""
    optimizer_state: Literal["reset", "carry"] = "reset"
    """reset: a fresh optimizer state; carry: copy every leaf whose path and shape the source state has."""
    data_position: Literal["reset", "carry"] = "reset"
    """reset: the data stream starts at 0; carry: continue where the source run's data stream was."""
    new_experts: Literal["copy", "init"] = "copy"
    """Experts added along an experts axis: copies of source expert (e mod E_src) with noise, or fresh init.
    """
    expert_noise: float = 0.01
    """Relative std of the multiplicative noise on copied experts (0: exact copies)."""
    rename: dict[str, str] = dataclasses.field(default_factory=dict)
    """Regex substitutions applied to source paths before matching, e.g. {"^layers/(\\\\d+)/moe/":
    "layers/\\\\1/ffn/"}."""

    def __post_init__(self) -> None:
        if self.optimizer_state not in ("reset", "carry"):
            raise ValueError(
                f"warm_start.optimizer_state={self.optimizer_state!r}: choose 'reset' or 'carry'"
            )
        if self.data_position not in ("reset", "carry"):
            raise ValueError(f"warm_start.data_position={self.data_position!r}: choose 'reset' or 'carry'")
        if self.new_experts not in ("copy", "init"):
            raise ValueError(f"warm_start.new_experts={self.new_experts!r}: choose 'copy' or 'init'")
        if not self.expert_noise >= 0:
            raise ValueError(f"warm_start.expert_noise={self.expert_noise} must be >= 0")
        for pattern in self.rename:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(
                    f"warm_start.rename pattern {pattern!r} is not a regular expression: {e}"
                ) from e


@dataclasses.dataclass(frozen=True)
class Source:
    """What a warm start reads: parameters (numpy, any tree), optimizer state and data position if known."""

    path: str
    kind: Literal["checkpoint", "hf"]
    params: PyTree
    opt_state: PyTree | None
    data_position: int
    step: int | None
    model_config: dict[str, Any] | None


def path_name(path: tuple[Any, ...]) -> str:
    """'layers/0/attn/wq' for a tree_util key path (dict keys, sequence indices and attribute names)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def flatten(tree: PyTree, is_leaf: Any = None) -> dict[str, Any]:
    return {path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def read_source(path: str, step: int | None = None) -> Source:
    """A Hugging Face directory (config.json + safetensors) or a training checkpoint, as a warm-start source.
    """
    if os.path.isfile(os.path.join(path, "config.json")):
        from moe_trainer.hf import load_hf

        model = load_hf(path)
        return Source(
            path,
            "hf",
            jax.tree.map(np.asarray, model.params),
            None,
            0,
            None,
            dataclasses.asdict(model.config),
        )
    from etils import epath

    if not epath.Path(path).exists():
        raise FileNotFoundError(
            f"init_from={path!r} does not exist: give a run output dir, its checkpoints/ "
            "dir, a step dir, or a Hugging Face model directory (config.json + safetensors)"
        )
    from moe_trainer.checkpoint import read_foreign_checkpoint

    state, meta, found = read_foreign_checkpoint(path, step)
    if "params" not in state:
        raise ValueError(f"init_from={path!r}: checkpoint step {found} has no params (keys {sorted(state)})")
    return Source(
        path,
        "checkpoint",
        state["params"],
        state.get("opt_state"),
        int(np.asarray(state.get("data_position", 0))),
        found,
        meta.get("model_config"),
    )


def _is_norm_gain(name: str) -> bool:
    last = name.rsplit("/", 1)[-1]
    return last == "norm" or last.endswith("_norm")


def _grow(
    name: str, src: np.ndarray, init: np.ndarray, axis: int, cfg: WarmStartConfig, rng: np.random.Generator
) -> np.ndarray:
    """``init`` with the source's entries along ``axis`` and new entries by the new-expert rule."""
    e_src, e_new = src.shape[axis], init.shape[axis]
    out = np.array(init, dtype=np.float32, copy=True)
    idx: list[slice | int] = [slice(None)] * src.ndim
    idx[axis] = slice(0, e_src)
    out[tuple(idx)] = src
    if name.rsplit("/", 1)[-1] == "router_bias":
        idx[axis] = slice(e_src, e_new)
        out[tuple(idx)] = 0.0
    elif cfg.new_experts == "copy":
        for e in range(e_src, e_new):
            idx[axis] = e
            original = np.take(src, e % e_src, axis=axis)
            out[tuple(idx)] = original * (1.0 + cfg.expert_noise * rng.standard_normal(original.shape))
    return out


def _mismatch(
    name: str, src_shape: tuple[int, ...], shape: tuple[int, ...], axes: tuple[str, ...]
) -> ValueError:
    return ValueError(
        f"warm start: parameter {name!r} has shape {tuple(src_shape)} in the source but {tuple(shape)} (axes "
        f"{axes}) in this model, and only a longer experts axis can be mapped. Match the model config field "
        "that sets this dimension to the source's, or map a differently named source parameter onto it with "
        "warm_start.rename"
    )


def map_params(
    source: dict[str, np.ndarray],
    fresh: dict[str, np.ndarray],
    axes: dict[str, tuple[str, ...]],
    cfg: WarmStartConfig,
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The new model's flat parameters from the source's (both keyed by path), and the report of the rules."""
    renamed: dict[str, np.ndarray] = {}
    for name, value in source.items():
        new_name = name
        for pattern, repl in cfg.rename.items():
            new_name = re.sub(pattern, repl, new_name)
        renamed[new_name] = np.asarray(value)
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"copied": [], "grown": {}, "new": {}, "dropped": []}
    for name, init in fresh.items():
        init = np.asarray(init)
        src = renamed.get(name)
        if src is not None and src.shape == init.shape:
            out[name] = src.astype(init.dtype)
            report["copied"].append(name)
        elif src is not None:
            ax = axes.get(name, ())
            diff = [i for i in range(init.ndim) if src.ndim != init.ndim or src.shape[i] != init.shape[i]]
            if (
                src.ndim != init.ndim
                or len(diff) != 1
                or ax[diff[0]] not in _EXPERT_AXES
                or src.shape[diff[0]] > init.shape[diff[0]]
            ):
                raise _mismatch(name, src.shape, init.shape, ax)
            out[name] = _grow(name, src, init, diff[0], cfg, rng).astype(init.dtype)
            rule = "zeros" if name.endswith("router_bias") else cfg.new_experts
            report["grown"][name] = {"from": list(src.shape), "to": list(init.shape), "new_entries": rule}
        elif _is_norm_gain(name):
            out[name] = np.ones_like(init)
            report["new"][name] = "ones (norm gain)"
        elif name.rsplit("/", 1)[-1] == "router_bias":
            out[name] = np.zeros_like(init)
            report["new"][name] = "zeros (router bias)"
        else:
            out[name] = init
            report["new"][name] = "init (this run's initialisation)"
    report["dropped"] = sorted(set(renamed) - set(fresh))
    return out, report


def carry_opt_state(source: dict[str, np.ndarray], fresh: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
    """Optimizer-state leaves copied from the source where path and shape agree; (state, carried, reset)."""
    out, carried = {}, 0
    for name, leaf in fresh.items():
        src = source.get(name)
        if src is not None and tuple(np.shape(src)) == tuple(np.shape(leaf)):
            out[name] = np.asarray(src).astype(np.asarray(leaf).dtype)
            carried += 1
        else:
            out[name] = leaf
    return out, carried, len(fresh) - carried


def warm_state(
    fresh: TrainState,
    shardings: TrainState,
    model: ModelConfig,
    init_from: str,
    cfg: WarmStartConfig,
    seed: int,
) -> tuple[TrainState, dict[str, Any]]:
    """The initial train state of a warm start: ``fresh`` (this run's initial state, on its shardings) with
    parameters mapped from ``init_from`` and, if asked, the optimizer state and data position carried."""
    from moe_trainer.params import is_axes_leaf, param_logical_axes

    source = read_source(init_from, cfg.step)
    fresh_params = flatten(jax.device_get(fresh.params))
    axes = flatten(param_logical_axes(model), is_leaf=is_axes_leaf)
    params, report = map_params(flatten(source.params), fresh_params, axes, cfg, seed)
    state = dataclasses.replace(fresh, params=_place(params, fresh.params, shardings.params))
    opt_report: dict[str, Any] = {"mode": cfg.optimizer_state}
    if cfg.optimizer_state == "carry":
        if source.opt_state is None:
            raise ValueError(
                f"warm_start.optimizer_state='carry' but {init_from} is a Hugging Face directory with "
                "no optimizer state; use optimizer_state='reset'"
            )
        opt, carried, reset = carry_opt_state(
            flatten(source.opt_state), flatten(jax.device_get(fresh.opt_state))
        )
        state = dataclasses.replace(state, opt_state=_place(opt, fresh.opt_state, shardings.opt_state))
        opt_report.update(carried_leaves=carried, reset_leaves=reset)
    if cfg.data_position == "carry":
        position = jax.device_put(np.asarray(source.data_position, np.int32), shardings.data_position)
        state = dataclasses.replace(state, data_position=position)
    report = {
        "init_from": init_from,
        "kind": source.kind,
        "source_step": source.step,
        "source_model_config": source.model_config,
        "optimizer_state": opt_report,
        "data_position": int(np.asarray(jax.device_get(state.data_position))),
        **report,
    }
    return state, report


def _place(flat: dict[str, Any], like: PyTree, shardings: PyTree) -> PyTree:
    """Unflatten ``flat`` (keyed by path) into ``like``'s tree and put every leaf on its sharding."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = [flat[path_name(p)] for p, _ in paths]
    return jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), shardings)


def write_report(report: dict[str, Any], out_dir: str) -> str:
    """warm_start.json in the run directory; returns a one-line summary for the log."""
    from moe_trainer.jsonio import write_json_atomic

    write_json_atomic(f"{out_dir.rstrip('/')}/warm_start.json", report, default=str)
    return (
        f"[warm start] from {report['init_from']} ({report['kind']}, step {report['source_step']}): "
        f"{len(report['copied'])} copied, {len(report['grown'])} grown, {len(report['new'])} new "
        f"({', '.join(sorted(set(report['new'].values()))) or '-'}), {len(report['dropped'])} dropped; "
        f"optimizer state {report['optimizer_state']['mode']}; data position {report['data_position']}"
    )
