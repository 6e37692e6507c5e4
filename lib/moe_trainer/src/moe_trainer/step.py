"""The jitted train step, model-agnostic: gradient accumulation, clipping, optimizer, health guards.

A train step is ``(state, batch) -> (state, metrics)`` where ``state`` is a ``TrainState`` (state.py: step,
params, optimizer state, health windows, RNG key data, data position; every leaf a JAX array, 0-d for
scalars). The model enters through a *loss function* with the contract of :data:`LossFn`; ``loss.py``
provides the language-model one, tests use tiny hand-written ones.

Gradient accumulation splits the batch into ``accum_steps`` equal microbatches along the batch axis and sums
their gradients in fp32 inside a ``lax.scan``. Each microbatch's loss is normalised by the token count of the
*whole* batch, so the summed gradient equals the large-batch gradient of every per-token term
(cross-entropy, logit z-loss); per-microbatch terms (the MoE balance loss, a batch statistic) are averaged
over microbatches, as every framework does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from moe_trainer import health as health_lib
from moe_trainer.optim import ScheduledTransformation
from moe_trainer.state import TrainState

PyTree = Any
Batch = dict[str, jax.Array]
# loss_fn(params, microbatch, total_tokens, n_micro) -> (loss contribution, stats summed over microbatches)
LossFn = Callable[[PyTree, Batch, jax.Array, int], tuple[jax.Array, dict[str, jax.Array]]]
# post_update(params, summed stats, n_micro) -> params; e.g. the aux-loss-free router-bias update
PostUpdateFn = Callable[[PyTree, dict[str, jax.Array], int], PyTree]


def init_state(params: PyTree, optimizer: optax.GradientTransformation, health_cfg: health_lib.HealthConfig,
               seed: int) -> TrainState:
    """A fresh train state around ``params`` (already placed/sharded by the caller)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        health=health_lib.init_health(health_cfg),
        rng=jax.random.key_data(jax.random.key(seed)),
        data_position=jnp.zeros((), jnp.int32),
    )


def accumulate_gradients(
    loss_fn: LossFn, params: PyTree, batch: Batch, accum_steps: int
) -> tuple[jax.Array, PyTree, dict[str, jax.Array]]:
    """Sum of microbatch losses and fp32 gradients, and summed stats, over ``accum_steps`` microbatches."""
    total_tokens = jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)
    grad_fn = jax.value_and_grad(lambda p, mb: loss_fn(p, mb, total_tokens, accum_steps), has_aux=True)
    if accum_steps == 1:
        (loss, stats), grads = grad_fn(params, batch)
        return loss, jax.tree.map(lambda g: g.astype(jnp.float32), grads), stats

    def split(x: jax.Array) -> jax.Array:
        if x.shape[0] % accum_steps:
            raise ValueError(
                f"batch size {x.shape[0]} is not divisible by accum_steps={accum_steps}; "
                "choose a batch_size that is a multiple of the accumulation steps"
            )
        return x.reshape(accum_steps, x.shape[0] // accum_steps, *x.shape[1:])

    micro = jax.tree.map(split, batch)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, stats_shape), _ = jax.eval_shape(grad_fn, params, first)

    def body(carry: tuple[jax.Array, PyTree, dict[str, jax.Array]], mb: Batch) -> tuple[Any, None]:
        loss_acc, grad_acc, stats_acc = carry
        (loss, stats), grads = grad_fn(params, mb)
        grad_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_acc, grads)
        stats_acc = jax.tree.map(jnp.add, stats_acc, stats)
        return (loss_acc + loss, grad_acc, stats_acc), None

    zeros_g = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zeros_s = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stats_shape)
    (loss, grads, stats), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros_g, zeros_s), micro)
    return loss, grads, stats


def apply_gradients(
    state: TrainState,
    grads: PyTree,
    loss: jax.Array,
    *,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    health_cfg: health_lib.HealthConfig,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """Clip, update, guard: returns the new state (unchanged params/opt_state if skipped) and step metrics."""
    health = state.health
    grad_norm = health_lib.global_norm(grads)
    decision = health_lib.skip_decision(health, loss, grad_norm, health_cfg)
    grads, grad_clipped = health_lib.clip_gradients(grads, grad_norm, health_cfg)
    lr_factor = schedule(state.step)
    if isinstance(optimizer, ScheduledTransformation):  # applies the factor itself (hyperball steps need it)
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params, lr_factor=lr_factor)
    else:
        updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u: u * lr_factor.astype(u.dtype), updates)
    updates, update_norm, update_clipped = health_lib.clip_update(updates, health, health_cfg)
    new_params = optax.apply_updates(state.params, updates)
    skip = decision["skip"]
    # Skipped step: nothing changes. The optimizer state is selected with `skip | (update_norm < 0)`, which
    # always equals `skip` (a norm is >= 0 or NaN, and NaN < 0 is false) but makes the selects of the new
    # moments depend on every update having been computed. Without that order XLA cannot write the new
    # moments into the donated buffers while the update fusions may still read the old ones, and copies all
    # moments first (102 copies, ~12 ms of op time per tiny-preset step on CPU).
    skip_state = skip | (update_norm < 0)
    new_state = dataclasses.replace(
        state,
        step=state.step + 1,
        params=jax.tree.map(lambda new, old: jnp.where(skip, old, new), new_params, state.params),
        opt_state=jax.tree.map(lambda new, old: jnp.where(skip_state, old, new), new_opt_state,
                               state.opt_state),
        health=health_lib.record(
            health, loss=loss, grad_norm=grad_norm, update_norm=update_norm, skipped=skip,
            grad_clipped=grad_clipped, update_clipped=update_clipped,
        ),
        data_position=state.data_position + 1,
    )
    metrics = {
        "loss": loss,
        "lr_factor": lr_factor,
        "grad_norm": grad_norm,
        "update_norm": update_norm,
        "skipped": skip,
        "grad_clipped": grad_clipped & ~skip,
        "update_clipped": update_clipped & ~skip,
        "nonfinite": decision["nonfinite"],
        "loss_spike": decision["loss_spike"],
        "grad_spike": decision["grad_spike"],
        # guard state for the health rules (watch.py): skipped steps so far, and whether update-norm
        # clipping has armed (its window half filled with applied updates)
        "skipped_total": new_state.health["skipped_total"],
        "update_filter_armed": health["n_updates"] >= max(health_cfg.update_window // 2, 2),
    }
    return new_state, metrics


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    health_cfg: health_lib.HealthConfig,
    accum_steps: int = 1,
    post_update: PostUpdateFn | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Build the (un-jitted) train step; the caller jits it with its shardings and donation."""
    if accum_steps < 1:
        raise ValueError(f"accum_steps={accum_steps} must be >= 1")

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        loss, grads, stats = accumulate_gradients(loss_fn, state.params, batch, accum_steps)
        new_state, metrics = apply_gradients(
            state, grads, loss, optimizer=optimizer, schedule=schedule, health_cfg=health_cfg
        )
        if post_update is not None:
            updated = post_update(new_state.params, stats, accum_steps)
            skip = metrics["skipped"]
            new_state = dataclasses.replace(new_state, params=jax.tree.map(
                lambda new, old: jnp.where(skip, old, new), updated, new_state.params
            ))
        metrics.update(stats)
        return new_state, metrics

    return train_step
