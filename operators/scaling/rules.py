"""Per-rung hyperparameters from documented rules, so that no rung of a ladder is hand-tuned (or mistuned).

Given a target non-embedding active parameter count N (or a compute budget C = 6·N·D at a fixed ratio
D = tokens_per_param·N), a rung is:

- **Shape.** Width ``d`` on a grid of multiples of 8 (at least 16); depth ``L(d) = max(2, round(log2 d) - 2)``
  (2 layers at d16, 3 at d32, 4 at d64, 5 at d128: deeper as wider, slowly, like Delphi's
  ``H / (64 + 4·log2 H - 9)``); heads of ``head_dim`` (8) so ``n_heads = d / head_dim`` and half as many KV
  heads (the chosen depth may be one layer off the rule when that lands closer to N); a dense SwiGLU MLP of
  ``mlp_ratio·d``. A base config with experts (``n_experts > 0``) gives MoE
  rungs: the same experts, top-k and shared experts as the base, each expert ``expert_ratio·d`` wide. The
  width whose N (the trainer's own count, :func:`moe_trainer.flops.count_params`: active, without embedding
  and head) is closest to the wanted N in log space is chosen; D then follows from the actual N.
- **Batch.** About ``sqrt(D)`` tokens per step, rounded to a power of two, at least ``min_batch_tokens``
  (the research note's rule: 240-2,250 steps across a CPU ladder); or, with ``batch_tokens`` set, the same
  tokens per step for every rung *and* the target, so the extrapolation carries no batch-size change (the
  2026-12-01 ladder's target doubled its batch over the top rung's and landed 16% off the law); steps
  rounded to a multiple of 4 so that 25/50/75/100% of the run are whole steps.
- **Learning rate.** The Delphi v2 form, ``lr = lr_ref · (B/B_ref)^0.5 · (T_ref/T)^0.3``, with the run
  length T in tokens (the token-horizon term whose absence cost Delphi v1 2.5% at 30x), times
  ``(d_ref/d)^width_exponent`` (plain AdamW on hidden matrices wants a smaller step as width grows; 0.5 is
  a middle between standard and muP scaling). The reference point is the tutorial model (d64, 2,048 tokens
  per step, 1.2M tokens, lr 0.004), whose learning rate was chosen by hand once.
- **Schedule.** Warmup-stable-decay: ``warmup_fraction`` (10%) warmup, stable, linear decay to 0 over the
  final ``decay_fraction`` (20%), as Delphi v2.

Compute is recorded twice: the trainer's FLOPs per token (:func:`moe_trainer.flops.flops_per_token`, head
and attention included) times tokens, which is what the runs cost; and ``6·N·D`` with N the non-embedding
active parameters, the x-axis the fit uses (for tiny models the head and attention overhead shrinks from
about 3x to 1.3x across a ladder, which bends the law in total FLOPs: research note §3.1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from moe_trainer.config import ModelConfig
from moe_trainer.flops import count_params, flops_per_token
from moe_trainer.hparams import DelphiV2Rule

EVAL_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
RECIPE_V2, RECIPE_V1 = "delphi-v2", "adamw-v1"
RECIPES = (RECIPE_V2, RECIPE_V1)


@dataclasses.dataclass(frozen=True)
class LadderRules:
    """The rules that map a size to a rung's model, batch, learning rate and schedule."""

    tokens_per_param: float = 20.0
    """D / N with N the non-embedding active parameters."""
    seq_len: int = 128
    """Tokens per training sequence (and per evaluation window)."""
    min_batch_tokens: int = 512
    """Smallest batch in tokens (the sqrt(D) rule)."""
    batch_tokens: int | None = None
    """Fixed batch in tokens for every rung and the target (a multiple of ``seq_len``); None: sqrt(D)."""
    head_dim: int = 8
    """Width of one attention head."""
    mlp_ratio: int = 4
    """Dense MLP hidden width / d_model."""
    expert_ratio: int = 2
    """Routed (and shared) expert hidden width / d_model, for MoE rungs."""
    min_width: int = 16
    """Narrowest rung."""
    max_width: int = 1024
    """Widest rung considered."""
    lr_ref: float = 0.004
    """Peak learning rate at the reference point."""
    batch_ref_tokens: int = 2048
    """Reference batch in tokens (B_ref)."""
    tokens_ref: float = 1.2e6
    """Reference run length in tokens (T_ref)."""
    width_ref: int = 64
    """Reference width (d_ref)."""
    batch_exponent: float = 0.5
    """Exponent of B/B_ref."""
    horizon_exponent: float = 0.3
    """Exponent of T_ref/T (Delphi v2's token-horizon correction)."""
    width_exponent: float = 0.5
    """Exponent of d_ref/d."""
    warmup_fraction: float = 0.1
    """Warmup steps / total steps."""
    decay_fraction: float = 0.2
    """Final linear decay to 0, as a fraction of the steps."""
    recipe: str = RECIPE_V2
    """``delphi-v2`` (AdamH, Delphi v2's rule :class:`moe_trainer.hparams.DelphiV2Rule` with ``v2``'s
    reference, no weight decay) or ``adamw-v1`` (AdamW with the preset's weight decay 0.1 and the ``lr_ref``
    rule above: every ladder before 2026-12-06)."""
    v2: DelphiV2Rule = DelphiV2Rule()
    """The v2 rule and its reference point (Marin's: 64 x 4,096 tokens per step, 2.5e9 tokens, 0.0063)."""
    v2_lr_multiple: float = 1.0
    """The v2 reference re-tuned on the rungs: both of ``v2``'s reference rates (``lr_base``,
    ``adam_lr_base``) and their cap ``max_lr`` times this (1: Marin's), the multiple the rungs'
    learning-rate check chose (``lr_multiples``; the reduced ladder's: experiments/exp15/analysis/
    rung_lr_grid.py). Each record says which reference trained its ladder (``ladder.v2_reference``)."""

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(
                f"LadderRules: recipe={self.recipe!r} is not one of {', '.join(RECIPES)}: 'delphi-v2' "
                "trains AdamH with a rate that falls with the token horizon, 'adamw-v1' the older AdamW rule"
            )
        if not self.v2_lr_multiple > 0:
            raise ValueError(
                f"LadderRules: v2_lr_multiple={self.v2_lr_multiple} must be > 0 (1: Marin's reference)"
            )
        if self.tokens_per_param <= 0 or self.lr_ref <= 0:
            raise ValueError(
                f"LadderRules: tokens_per_param={self.tokens_per_param} and lr_ref={self.lr_ref} must be > 0"
            )
        if self.min_width < 8 or self.min_width % 8 or self.max_width < self.min_width:
            raise ValueError(
                f"LadderRules: min_width={self.min_width} must be a multiple of 8 (>= 8) and "
                f"max_width={self.max_width} at least as large"
            )
        fixed = self.batch_tokens
        if fixed is not None and (fixed < self.seq_len or fixed % self.seq_len):
            raise ValueError(
                f"LadderRules: batch_tokens={self.batch_tokens} must be a positive multiple of "
                f"seq_len={self.seq_len} (or None for the sqrt(D) rule)"
            )
        if not 0 <= self.warmup_fraction < 1 or not 0 < self.decay_fraction <= 1:
            raise ValueError("LadderRules: warmup_fraction must be in [0, 1) and decay_fraction in (0, 1]")


    @property
    def v2_rule(self) -> DelphiV2Rule:
        """``v2`` at the re-tuned reference: its rates and their cap times ``v2_lr_multiple``."""
        m, v2 = self.v2_lr_multiple, self.v2
        if m == 1.0:
            return v2
        return dataclasses.replace(
            v2, lr_base=m * v2.lr_base, adam_lr_base=m * v2.adam_lr_base, max_lr=m * v2.max_lr
        )

    def v2_reference(self) -> dict[str, Any]:
        """What a ``delphi-v2`` record says about the reference its ladder trained at (Marin's x the
        multiple, and the resulting base rates and cap)."""
        v2 = self.v2_rule
        return {"rule": "DelphiV2Rule", "multiple_of_marin": self.v2_lr_multiple, "lr_base": v2.lr_base,
                "adam_lr_base": v2.adam_lr_base, "max_lr": v2.max_lr}


@dataclasses.dataclass(frozen=True)
class RungSpec:
    """One rung's (or the target's) model and training settings, with its parameter and compute counts."""

    name: str
    model: Mapping[str, Any]
    batch_size: int
    seq_len: int
    num_steps: int
    lr: float
    warmup_steps: int
    decay_fraction: float
    n_params: int
    """Non-embedding active parameters (the fit's N)."""
    n_total: int
    """Every parameter, embedding and head included."""
    flops_per_token: float
    """The trainer's training FLOPs per token (forward + backward)."""
    lr_multiple: float = 1.0
    """The multiple of the rule's learning rate this run trains at (1: the rule; the check's runs differ)."""
    recipe: str = RECIPE_V1
    """Which recipe's optimizer settings :func:`trainer_overrides` writes (:data:`RECIPES`)."""
    optimizer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The recipe's other optimizer settings (``delphi-v2``: the Adam group's rate ``adam_lr``, ``beta1``,
    ``beta2``, ``eps``, ``max_grad_norm``); ``lr`` is the hyperball groups' rate there."""

    @property
    def batch_tokens(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def tokens(self) -> int:
        return self.num_steps * self.batch_tokens

    def eval_steps(self, fractions: tuple[float, ...] = EVAL_FRACTIONS) -> tuple[int, ...]:
        """The optimizer steps at ``fractions`` of the run."""
        return tuple(int(round(f * self.num_steps)) for f in fractions)

    def compute_6nd(self, step: int | None = None) -> float:
        """6·N·D at ``step`` (default: the end), N non-embedding active."""
        return 6.0 * self.n_params * self.batch_tokens * (self.num_steps if step is None else step)

    def compute_trainer(self, step: int | None = None) -> float:
        """The trainer's FLOPs per token times the tokens seen by ``step`` (default: the end)."""
        return self.flops_per_token * self.batch_tokens * (self.num_steps if step is None else step)

    def with_lr_multiple(self, multiple: float) -> RungSpec:
        """The same rung with its learning rate scaled (the mistuning check)."""
        suffix = f"-lrx{multiple:g}"
        optimizer = dict(self.optimizer)
        if "adam_lr" in optimizer:  # v2: both groups' rates move together
            optimizer["adam_lr"] = optimizer["adam_lr"] * multiple
        return dataclasses.replace(
            self,
            name=self.name + suffix,
            lr=self.lr * multiple,
            lr_multiple=self.lr_multiple * multiple,
            optimizer=optimizer,
        )


def layers_for(width: int) -> int:
    """Depth of a rung of ``width``: max(2, round(log2 width) - 2)."""
    return max(2, round(math.log2(width)) - 2)


def model_for(width: int, base: Mapping[str, Any], rules: LadderRules) -> dict[str, Any]:
    """ModelConfig fields of the rung of ``width``, on top of the base config's fields."""
    heads = max(1, width // rules.head_dim)
    fields = {
        **base,
        "d_model": width,
        "n_layers": layers_for(width),
        "n_heads": heads,
        "n_kv_heads": max(1, heads // 2) if heads % 2 == 0 else heads,
        "head_dim": rules.head_dim,
        "d_ff": rules.mlp_ratio * width,
        "max_seq_len": rules.seq_len,
    }
    if int(base.get("n_experts", 0) or 0) > 0:
        fields["expert_d_ff"] = rules.expert_ratio * width
        if base.get("n_shared_experts"):
            fields["shared_d_ff"] = rules.expert_ratio * width
    return fields


def _counts(fields: Mapping[str, Any], seq_len: int) -> tuple[int, int, float]:
    cfg = ModelConfig(**fields)
    total, active = count_params(cfg)
    # count_params' active count excludes the embedding table and the output head already
    return active, total, flops_per_token(cfg, seq_len).total


def _pow2(x: float) -> int:
    return 1 << max(0, round(math.log2(max(x, 1.0))))


def rung_for_params(
    n_params: float, base: Mapping[str, Any], rules: LadderRules, name: str | None = None
) -> RungSpec:
    """The rung whose non-embedding active parameter count is closest (in log) to ``n_params``: widths on
    the grid, each at the rule's depth or one layer either side (so budgets 2x apart get distinct rungs)."""
    if not n_params > 0:
        raise ValueError(f"rung_for_params: n_params={n_params} must be > 0")
    best: tuple[float, int, int] | None = None
    for width in range(rules.min_width, rules.max_width + 1, 8):
        rule_depth = layers_for(width)
        for depth in sorted({max(2, rule_depth - 1), rule_depth, rule_depth + 1}):
            fields = {**model_for(width, base, rules), "n_layers": depth}
            active = _counts(fields, rules.seq_len)[0]
            gap = abs(math.log(active / n_params)) + (0.0 if depth == rule_depth else 1e-3)
            if best is None or gap < best[0]:
                best = (gap, width, depth)
    assert best is not None
    _, width, depth = best
    fields = {**model_for(width, base, rules), "n_layers": depth}
    active, total, fpt = _counts(fields, rules.seq_len)
    tokens = rules.tokens_per_param * active
    batch_tokens = rules.batch_tokens or max(rules.min_batch_tokens, _pow2(math.sqrt(tokens)))
    batch_size = max(1, batch_tokens // rules.seq_len)
    steps = max(4, 4 * round(tokens / (batch_size * rules.seq_len) / 4))
    lr, optimizer = learning_rate(rules, width, batch_size, steps)
    return RungSpec(
        name=name or f"d{width}-L{fields['n_layers']}",
        model=fields,
        batch_size=batch_size,
        seq_len=rules.seq_len,
        num_steps=steps,
        lr=lr,
        warmup_steps=max(1, round(rules.warmup_fraction * steps)),
        decay_fraction=rules.decay_fraction,
        n_params=active,
        n_total=total,
        flops_per_token=fpt,
        recipe=rules.recipe,
        optimizer=optimizer,
    )


def learning_rate(
    rules: LadderRules, width: int, batch_size: int, steps: int
) -> tuple[float, dict[str, Any]]:
    """The rung's main learning rate and its recipe's other optimizer settings.

    ``adamw-v1``: ``lr_ref · (B/B_ref)^0.5 · (T_ref/T)^0.3 · (d_ref/d)^0.5`` (AdamW; nothing else set).
    ``delphi-v2``: :meth:`DelphiV2Rule.at` (at the ``v2_lr_multiple`` reference) at the rung's batch and run
    length, the one implementation of Delphi v2's rule (its hyperball rate as ``lr``; Adam's rate, betas,
    epsilon and clip in the dict)."""
    run_tokens = steps * batch_size * rules.seq_len
    if rules.recipe == RECIPE_V2:
        hp = rules.v2_rule.at(batch_size, rules.seq_len, run_tokens)
        return hp.lr, {
            "adam_lr": hp.adam_lr,
            "beta1": hp.beta1,
            "beta2": hp.beta2,
            "eps": hp.eps,
            "max_grad_norm": hp.max_grad_norm,
        }
    lr = (
        rules.lr_ref
        * (batch_size * rules.seq_len / rules.batch_ref_tokens) ** rules.batch_exponent
        * (rules.tokens_ref / run_tokens) ** rules.horizon_exponent
        * (rules.width_ref / width) ** rules.width_exponent
    )
    return lr, {}


def rung_for_compute(compute_6nd: float, base: Mapping[str, Any], rules: LadderRules) -> RungSpec:
    """The rung for a budget C = 6·N·D at the rules' tokens per parameter: N = sqrt(C / (6·ratio))."""
    if not compute_6nd > 0:
        raise ValueError(f"rung_for_compute: compute={compute_6nd} must be > 0 (FLOPs, 6·N·D)")
    return rung_for_params(math.sqrt(compute_6nd / (6.0 * rules.tokens_per_param)), base, rules)


def trainer_overrides(rung: RungSpec) -> dict[str, Any]:
    """The train operator's ``overrides`` for a rung: its recipe's optimizer and the WSD schedule
    (``adamw-v1`` writes exactly what every ladder before the recipes wrote, so their hashes stay)."""
    schedule = {
        "schedule.kind": "wsd",
        "schedule.warmup_steps": rung.warmup_steps,
        "schedule.decay_fraction": rung.decay_fraction,
        "schedule.min_lr_ratio": 0.0,
    }
    if rung.recipe == RECIPE_V1:
        return {"optimizer.lr": rung.lr, **schedule}
    o = rung.optimizer
    return {
        "optimizer.name": "adamh",
        "optimizer.hyperball_lr": rung.lr,
        "optimizer.lr": o["adam_lr"],
        "optimizer.beta1": o["beta1"],
        "optimizer.beta2": o["beta2"],
        "optimizer.eps": o["eps"],
        "health.max_grad_norm": o["max_grad_norm"],
        **schedule,
    }
