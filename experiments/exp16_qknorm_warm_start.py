"""exp16: Marin's 32B rescue at tiny scale: warm-start a QK-norm model from a model trained without QK-norm.

Issue: #16 of the repository named by MARIN_ISSUE_REPO (the file name is the link).

Background: Marin's 32B run (a Llama backbone) kept spiking at 70k-80k steps whatever the clipping; it was
rescued by switching to the Qwen3 backbone, which adds QK-norm to attention, warm-started from the step-80K
Llama weights with a 1,000-step re-warmup: the loss jumped, recovered within about 10B tokens, and the spikes
never came back (docs/reports/marin-32b-retro.md in Marin's repository).

Hypothesis: the same surgery on the tutorial's tiny MoE (trained without QK-norm on the tutorial's two-source
mixture) makes the training loss jump at the switch (QK-norm with unit gains rescales every attention logit)
and then recover: within the first fifth of the warm-started run its loss is back within 0.05 nats of the
control, the same warm start without the architecture change, and it ends no worse than the control. Both warm
starts reset the optimizer state, re-warm the learning rate over 20 steps and continue the source run's data
stream where it stopped (`warm_start.data_position: carry`), so the only difference is QK-norm.

Result (2026-12-01, full corpus, docs/benchmarks/trainer-data.md): the loss jumped by 0.197 nats at the switch
(against the control on the same batch), was back within 0.040 nats over steps 11-50, and was still 0.014 nats
behind the control after 250 steps (bits per byte 1.657/1.769 vs 1.652/1.763, python/prose): the recovery
holds, "no worse than the control" does not at this scale, where there are no spikes for QK-norm to prevent.

    MARIN_ISSUE_REPO=local/experiments python experiments/exp16_qknorm_warm_start.py
    marin dashboard     # train/exp16-*: the source's curve, and the two warm starts' jump and recovery

The data steps are the tutorial's (imported: same hashes, reused when the tutorial has run); only the three
train steps and the two evaluations are new. `warm_start.json` in each warm-started run lists the parameters
copied and the new ones (the q_norm/k_norm gains, at one).
"""

from __future__ import annotations

import dataclasses

from experiments.tutorials.tiny_moe import SMALL, TINY_MOE, tiny_moe, tiny_moe_eval
from marin import Criterion, Step, executor_main, output_path_of, this_output_path
from marin.status.console import ConsoleProgress
from operators.evaluate import evaluate
from operators.train import TrainConfig, WarmStartConfig, train

SOURCE_STEPS = 40 if SMALL else 400
WARM_STEPS = 30 if SMALL else 250
REWARMUP = 5 if SMALL else 20
WARM = WarmStartConfig(optimizer_state="reset", data_position="carry")

source_no_qknorm = Step(
    name="train/exp16-no_qknorm",
    fn=train,
    description="the tutorial model without QK-norm (the 'Llama' phase)",
    config=dataclasses.replace(
        tiny_moe.config,
        output_path=this_output_path(),
        model={**TINY_MOE, "qk_norm": False},
        num_steps=SOURCE_STEPS,
        checkpoint_every=SOURCE_STEPS // 2,
        mixture_stages=(),
    ),
)


def warm_started(qk_norm: bool) -> TrainConfig:
    return dataclasses.replace(
        source_no_qknorm.config,
        model={**TINY_MOE, "qk_norm": qk_norm},
        init_from=output_path_of(source_no_qknorm),
        warm_start=WARM,
        num_steps=WARM_STEPS,
        checkpoint_every=WARM_STEPS // 2,
        overrides={**tiny_moe.config.overrides, "schedule.warmup_steps": REWARMUP},
    )


qknorm_warm = Step(
    name="train/exp16-qknorm_warm",
    fn=train,
    config=warm_started(True),
    description="warm start with QK-norm (gains at one): the 'Qwen3' switch",
)
control_warm = Step(
    name="train/exp16-no_qknorm_warm",
    fn=train,
    config=warm_started(False),
    description="control: the same warm start without the architecture change",
)

qknorm_warm_eval = Step(
    name="eval/exp16-qknorm_warm",
    fn=evaluate,
    description="bits per byte after the switch",
    config=dataclasses.replace(tiny_moe_eval.config, checkpoint=output_path_of(qknorm_warm)),
)
control_warm_eval = Step(
    name="eval/exp16-no_qknorm_warm",
    fn=evaluate,
    description="bits per byte, control",
    config=dataclasses.replace(tiny_moe_eval.config, checkpoint=output_path_of(control_warm)),
)

# "Ends no worse than the control": held-out bits per byte (both domains together) no higher than the
# control's; and the recovery: the final training loss within 0.05 nats of the control's.
CRITERIA = [
    Criterion(metric="eval/exp16-qknorm_warm:macro.bpb", better="lower", baseline=control_warm_eval,
              min_effect=0.0),
    Criterion(metric="train/exp16-qknorm_warm:loss", better="lower", baseline=control_warm, min_effect=-0.05),
]

if __name__ == "__main__":
    executor_main(
        steps=[qknorm_warm_eval, control_warm_eval],
        criterion=CRITERIA,
        tags=("qk_norm", "warm_start", "stability"),
        description="exp16: QK-norm warm start (the 32B rescue) vs the same warm start without it",
        publishers=[ConsoleProgress()],
    )
