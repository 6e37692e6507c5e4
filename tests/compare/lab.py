"""A tiny real lab for the compare tests: a baseline experiment and an ablation that halves the learning rate
and renames its train and eval steps (the recommended ablation pattern), run by the real executor.

The step functions write the trainer's and evaluators' record formats (docs/formats.md): `metrics.jsonl`,
`train_config.json`, `train_result.json` (with `flops_per_token`), `eval.json` and `choices.json`. The loss
depends on the learning rate, so the two runs' numbers differ by known amounts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from marin import Criterion, Step, output_path_of, this_output_path

ROWS = 200
BATCH, SEQ, FLOPS_PER_TOKEN = 4, 16, 1000.0


@dataclasses.dataclass(frozen=True)
class FakeTrainConfig:
    lr: float
    seed: int = 0
    output_path: str = this_output_path()


@dataclasses.dataclass(frozen=True)
class FakeEvalConfig:
    checkpoint: str
    output_path: str = this_output_path()


def loss_at(step: int, lr: float) -> float:
    return 2.0 + 4.0 * math.exp(-step * lr * 2.5) + 0.05 * math.sin(step)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def fake_train(config: FakeTrainConfig) -> None:
    out = config.output_path
    rows = [{"step": s, "loss": loss_at(s, config.lr), "lr": config.lr, "grad_norm": 1.0 / s,
             "tokens_per_s": 1000.0, "skipped": False, "time": 1.0 * s} for s in range(1, ROWS + 1)]
    rows.insert(50, {"step": 50, "eval": {"domains": {"python": {"bpb": 1.0}}}})  # an eval row: not training
    _write(f"{out}/metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    _write(f"{out}/train_config.json", json.dumps({"data": {"batch_size": BATCH, "seq_len": SEQ}}))
    _write(f"{out}/train_result.json", json.dumps({"step": ROWS, "loss": rows[-1]["loss"],
                                                   "flops_per_token": FLOPS_PER_TOKEN}))


def bpb(lr: float, domain: str) -> float:
    return round(1.5 - lr * 10 + (0.2 if domain == "prose" else 0.0), 6)


def accuracy(lr: float) -> tuple[float, float]:
    return round(0.3 + lr * 20, 6), 0.02


def fake_eval(config: FakeEvalConfig) -> None:
    with open(f"{config.checkpoint}/metrics.jsonl") as f:
        lr = json.loads(f.readline())["lr"]
    domains = {d: {"bpb": bpb(lr, d), "loss": 2 * bpb(lr, d), "tokens": 100, "bytes": 400}
               for d in ("python", "prose")}
    macro = sum(d["bpb"] for d in domains.values()) / 2
    _write(f"{config.output_path}/eval.json", json.dumps({"domains": domains, "macro": {"bpb": macro}}))
    acc, se = accuracy(lr)
    _write(f"{config.output_path}/choices.json", json.dumps(
        {"tasks": {"stdlib_next_line_v1": {"items": 100, "acc": acc, "acc_stderr": se, "chance": 0.25}}}))


train = Step(name="train/tiny", fn=fake_train, config=FakeTrainConfig(lr=0.004))
evaluation = Step(name="eval/tiny", fn=fake_eval, config=FakeEvalConfig(checkpoint=output_path_of(train)))
train_half = Step(name="train/tiny-lr_half", fn=fake_train,
                  config=dataclasses.replace(train.config, lr=0.002))
evaluation_half = Step(name="eval/tiny-lr_half", fn=fake_eval,
                       config=FakeEvalConfig(checkpoint=output_path_of(train_half)))
train_quarter = Step(name="train/tiny-lr_quarter", fn=fake_train,
                     config=dataclasses.replace(train.config, lr=0.001))
evaluation_quarter = Step(name="eval/tiny-lr_quarter", fn=fake_eval,
                          config=FakeEvalConfig(checkpoint=output_path_of(train_quarter)))
CRITERION = Criterion(metric="eval/tiny-lr_half:macro.bpb", better="lower", baseline=evaluation,
                      min_effect=0.0)


def lab_prefix(prefix: str) -> tuple[str, str]:
    """`run_lab` with the real executor on the local backend under `prefix` (for module-scoped fixtures)."""
    from marin import ExecutorMainConfig, run_experiment

    def run(steps: list[Any], **kw: Any) -> Any:
        return run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False, **kw)

    return run_lab(run)


def run_lab(run_marin: Any) -> tuple[str, str]:
    """Run the baseline, then the ablation (which reuses the baseline's eval by identity, as exp2 does);
    returns both experiment ids."""
    base = run_marin([evaluation], script="experiments/exp90_tiny.py", description="baseline")
    ablation = run_marin([evaluation, evaluation_half], script="experiments/exp91_tiny_lr_half.py",
                         description="half the learning rate", criterion=CRITERION,
                         hypothesis="half the learning rate lowers bits per byte")
    return base.experiment_id, ablation.experiment_id
