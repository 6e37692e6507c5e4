"""The fused loss on a mesh with a vocab-sharded output head never moves a vocab-sized array between devices:
the compiled program's collectives (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute)
carry hidden states, per-token statistics and the head's FSDP shards, but no array with the full vocabulary as
a dimension. A replicated head would gather [d_model, vocab] on every step and a gathered logits chunk
[tokens, vocab]; at a 150k vocabulary either costs more than the rest of the loss."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from moe_trainer import ModelConfig, init_params, make_mesh, shard_params
from moe_trainer.loss import make_lm_loss

VOCAB = 200  # no other dimension of the model or the batch equals it
CFG = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                  n_experts=4, top_k=2, expert_d_ff=16, logit_z_loss_coef=0.01, dispatch="ep_alltoall")
COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                        r"(-start)?\(")
SHAPE = re.compile(r"\[([\d,]*)\]")


def collectives(hlo: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    """(op, result shapes) of every collective in compiled HLO text."""
    out = []
    for line in hlo.splitlines():
        m = COLLECTIVE.search(line)
        if m:
            shapes = [tuple(int(d) for d in s.split(",") if d) for s in SHAPE.findall(m.group(1))]
            out.append((m.group(2), shapes))
    return out


def _vocab_sized(hlo: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    return [(op, shapes) for op, shapes in collectives(hlo) if any(VOCAB in s for s in shapes)]


def _compiled_loss_and_grad(cfg: ModelConfig, mesh: Any, head_spec: P | None = None) -> str:
    params = shard_params(init_params(cfg, jax.random.key(0)), cfg, mesh)
    loss_fn = make_lm_loss(cfg, mesh=mesh)
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(0, VOCAB, (4, 9)).astype(np.int32))
    batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:], "segment_ids": jnp.zeros((4, 8), jnp.int32),
             "loss_mask": jnp.ones((4, 8), jnp.float32)}
    batch = jax.device_put(batch, NamedSharding(mesh, P(("data", "expert"))))

    def loss(p: dict, b: dict) -> jax.Array:
        if head_spec is not None:  # the negative control: force the head to another layout inside the step
            p = {**p,
                 "lm_head": jax.lax.with_sharding_constraint(p["lm_head"], NamedSharding(mesh, head_spec))}
        return loss_fn(p, b, jnp.float32(32.0), 1)[0]

    return jax.jit(jax.value_and_grad(loss)).lower(params, batch).compile().as_text()


def test_the_sharded_fused_loss_moves_no_vocab_sized_array() -> None:
    assert jax.device_count() == 8, "the root conftest must give JAX 8 fake CPU devices"
    mesh = make_mesh(data=2, expert=2, model=2)
    hlo = _compiled_loss_and_grad(CFG.replace(loss_chunk_tokens=8), mesh)
    found = collectives(hlo)
    assert found, "expected the sharded step to communicate at all"
    assert _vocab_sized(hlo) == [], _vocab_sized(hlo)


def test_the_check_sees_a_replicated_head() -> None:
    """Negative control: the same step with the head forced to be replicated gathers [d_model, vocab]."""
    mesh = make_mesh(data=2, expert=2, model=2)
    hlo = _compiled_loss_and_grad(CFG.replace(loss_chunk_tokens=8), mesh, head_spec=P())
    assert any(op == "all-gather" for op, _ in _vocab_sized(hlo)), collectives(hlo)
