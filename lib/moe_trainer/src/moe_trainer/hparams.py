"""Hyperparameters from the compute budget: Marin's Delphi v2 (AdamH) rule and its MoE "May recipe" refit.

Read in marin-community/marin (formulas and constants carried over, code our own):
``experiments/scaling_law_sweeps/completed_adamh.py`` (``CompletedAdamHHeuristic``, the Delphi v2 ladder) and
``experiments/grug/moe_hero_ep/heuristic.py`` (``MoeHeuristic``, the hero's MuonH refit, issue #5951).

**Delphi v2** (:class:`DelphiV2Rule`). With B the batch in tokens, T the training tokens, B0 = 64 sequences of
4,096 tokens and T0 = 2.5e9 (its ~130M-parameter reference, tuned by Vizier), r = (B/B0)·(T0/T):

    lr (hyperball groups) = 0.0063 · sqrt(B/B0) · (T0/T)^0.3        capped at 0.01
    adam_lr (Adam group)  = 6.56e-4 · sqrt(r)                         capped at 0.01
    ε                     = 1.85e-8 / sqrt(r)
    β1 = 0.9,  β2 = clip(0.9999^(B/B0), 0.9, 0.9999)                  (a constant half-life in tokens)
    gradient clip 0.1, logit z-loss 1e-7, 10% warmup, linear decay to 0 over the last 20% (WSD)

Marin counts B in sequences at its fixed 4,096-token context; here B is in tokens (B0 = 262,144), which is
the same rule at 4,096 and stays meaningful at the short contexts of CPU runs. **From a budget** C (FLOPs):
T = C / F with F the model's training FLOPs per token (``flops.flops_per_token(...).total`` = 3 × forward,
as Marin divides by 3 × forward FLOPs); the batch is the power of two (in sequences) nearest above
T / (target_steps · seq) — Marin aims at 2^16 steps — halved while lr or adam_lr reach the cap or β2 the
floor, and never below ``min_batch``.

**May recipe** (:class:`MoeMayRule`, the hero's MuonH heuristic; d = model width):

    adam_lr = 0.06602 · T^-0.395 · d^-0.150 · sqrt(B)  capped at 0.05;  muonh lr = 13/3 · adam_lr (cap 0.05)
    ε = 9.676e-18 · sqrt(T/B);  β1 = 0.9062;  β2 = clip(0.999^(B/131072), 0.95, 0.9999)
    linear decay to 5% of the peak, no gradient clipping ("1pct-noclip": 1% warmup, from the label)

Both return :class:`Hyperparameters`, whose ``overrides()`` are trainer-config overrides
(``operators.train.TrainConfig.overrides`` or ``--section.field`` flags).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

REFERENCE_SEQ = 4096  # Marin's context length, at which its batch sizes are counted in sequences


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """Everything a rule decides for one run."""

    optimizer: str
    batch_size: int
    """Sequences per step."""
    seq_len: int
    num_steps: int
    tokens: float
    """Training tokens the rule was evaluated at (the budget's tokens; the run trains batch·seq·num_steps)."""
    lr: float
    """Peak learning rate of the hyperball groups (MuonH / AdamH)."""
    adam_lr: float
    """Peak learning rate of the plain Adam group."""
    eps: float
    beta1: float
    beta2: float
    max_grad_norm: float | None
    z_loss: float | None
    """Logit z-loss weight (None: leave the model's)."""
    warmup_fraction: float
    decay_fraction: float
    """Fraction of the run in the final linear decay (WSD); 1.0 means a linear decay after warmup."""
    min_lr_ratio: float

    def overrides(self) -> dict[str, Any]:
        """Trainer-config overrides (``section.field`` keys) that apply these hyperparameters."""
        warmup = max(1, int(round(self.warmup_fraction * self.num_steps)))
        out: dict[str, Any] = {
            "optimizer.name": self.optimizer, "optimizer.hyperball_lr": self.lr, "optimizer.lr": self.adam_lr,
            "optimizer.eps": self.eps, "optimizer.beta1": self.beta1, "optimizer.beta2": self.beta2,
            "health.max_grad_norm": self.max_grad_norm,
            "schedule.kind": "linear" if self.decay_fraction >= 1.0 else "wsd",
            "schedule.warmup_steps": warmup, "schedule.min_lr_ratio": self.min_lr_ratio,
            "schedule.decay_fraction": min(self.decay_fraction, 1.0),
            "data.batch_size": self.batch_size, "data.seq_len": self.seq_len, "num_steps": self.num_steps,
        }
        if self.z_loss is not None:
            out["model.logit_z_loss_coef"] = self.z_loss
        return out


def _check(batch_size: int, seq_len: int, tokens: float) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must be >= 1")
    if tokens < batch_size * seq_len:
        raise ValueError(f"tokens={tokens:g} is less than one batch ({batch_size} x {seq_len}): raise the "
                         "budget or lower the batch")


@dataclasses.dataclass(frozen=True)
class DelphiV2Rule:
    """Marin's Delphi v2 (completed AdamH) hyperparameter rule; see the module docstring."""

    optimizer: str = "adamh"
    """The optimizer the rule was fitted for (Delphi: adamh); muonh uses the same rates."""
    reference_batch_tokens: int = 64 * REFERENCE_SEQ
    reference_tokens: float = 2.5e9
    lr_base: float = 0.0063
    adam_lr_base: float = 6.56e-4
    eps_base: float = 1.85e-8
    beta1: float = 0.9
    beta2_base: float = 0.9999
    min_beta2: float = 0.9
    max_beta2: float = 0.9999
    max_lr: float = 0.01
    max_grad_norm: float = 0.1
    z_loss: float = 1e-7
    warmup_fraction: float = 0.1
    decay_fraction: float = 0.2
    target_steps: int = 2**16
    min_batch: int = 8

    def _lr(self, b: float, tokens: float) -> float:
        decay: float = (self.reference_tokens / tokens) ** 0.3  # float ** float is typed Any (may be complex)
        return min(self.max_lr, self.lr_base * math.sqrt(b / self.reference_batch_tokens) * decay)

    def _adam_lr(self, b: float, tokens: float) -> float:
        r = (b / self.reference_batch_tokens) * (self.reference_tokens / tokens)
        return min(self.max_lr, self.adam_lr_base * math.sqrt(r))

    def _beta2(self, b: float) -> float:
        beta2: float = self.beta2_base ** (b / self.reference_batch_tokens)  # float ** float is typed Any
        return max(self.min_beta2, min(self.max_beta2, beta2))

    def at(self, batch_size: int, seq_len: int, tokens: float) -> Hyperparameters:
        """The hyperparameters of a run of ``tokens`` tokens at ``batch_size`` sequences of ``seq_len``."""
        _check(batch_size, seq_len, tokens)
        b = batch_size * seq_len
        r = (b / self.reference_batch_tokens) * (self.reference_tokens / tokens)
        return Hyperparameters(
            optimizer=self.optimizer, batch_size=batch_size, seq_len=seq_len,
            num_steps=max(1, round(tokens / b)), tokens=tokens, lr=self._lr(b, tokens),
            adam_lr=self._adam_lr(b, tokens), eps=self.eps_base / math.sqrt(r), beta1=self.beta1,
            beta2=self._beta2(b), max_grad_norm=self.max_grad_norm, z_loss=self.z_loss,
            warmup_fraction=self.warmup_fraction, decay_fraction=self.decay_fraction, min_lr_ratio=0.0)

    def batch_for(self, seq_len: int, tokens: float) -> int:
        """Marin's batch choice: ~target_steps steps, a power of two, halved while a rate is capped."""
        batch: int = 2 ** max(0, math.ceil(math.log2(max(tokens / (self.target_steps * seq_len), 1.0))))
        while batch > self.min_batch:
            b = batch * seq_len
            if (self._lr(b, tokens) < self.max_lr and self._adam_lr(b, tokens) < self.max_lr
                    and self._beta2(b) > self.min_beta2):
                break
            batch //= 2
        return max(batch, self.min_batch)

    def for_budget(self, flops: float, flops_per_token: float, seq_len: int) -> Hyperparameters:
        """Hyperparameters for a compute budget: T = flops / flops_per_token (training FLOPs per token)."""
        if flops <= 0 or flops_per_token <= 0:
            raise ValueError(f"flops={flops:g} and flops_per_token={flops_per_token:g} must be > 0")
        tokens = flops / flops_per_token
        return self.at(self.batch_for(seq_len, tokens), seq_len, tokens)

    def for_model(self, flops: float, model: Any, seq_len: int) -> Hyperparameters:
        """``for_budget`` with the training FLOPs per token of a ModelConfig (``flops.flops_per_token``)."""
        from moe_trainer.flops import flops_per_token

        return self.for_budget(flops, flops_per_token(model, seq_len).total, seq_len)


@dataclasses.dataclass(frozen=True)
class MoeMayRule:
    """The hero's MuonH rule (May recipe refit, marin #5951); see the module docstring."""

    lr_coeff: float = 0.06602
    lr_tokens_exp: float = -0.395
    lr_dim_exp: float = -0.150
    muonh_ratio: float = 13 / 3
    eps_coeff: float = 9.676e-18
    beta1: float = 0.9062
    beta2_base: float = 0.999
    beta2_reference_tokens: int = 131_072
    min_beta2: float = 0.95
    max_beta2: float = 0.9999
    max_lr: float = 0.05
    min_lr_ratio: float = 0.05
    warmup_fraction: float = 0.01

    def at(self, batch_size: int, seq_len: int, tokens: float, d_model: int) -> Hyperparameters:
        _check(batch_size, seq_len, tokens)
        b = batch_size * seq_len
        adam_lr = min(self.max_lr, self.lr_coeff * tokens ** self.lr_tokens_exp * d_model ** self.lr_dim_exp
                      * math.sqrt(b))
        beta2 = max(self.min_beta2, min(self.max_beta2, self.beta2_base ** (b / self.beta2_reference_tokens)))
        return Hyperparameters(
            optimizer="muonh", batch_size=batch_size, seq_len=seq_len, num_steps=max(1, round(tokens / b)),
            tokens=tokens, lr=min(self.max_lr, self.muonh_ratio * adam_lr), adam_lr=adam_lr,
            eps=self.eps_coeff * math.sqrt(tokens / b), beta1=self.beta1, beta2=beta2, max_grad_norm=None,
            z_loss=None, warmup_fraction=self.warmup_fraction, decay_fraction=1.0,
            min_lr_ratio=self.min_lr_ratio)


__all__ = ["DelphiV2Rule", "Hyperparameters", "MoeMayRule"]
