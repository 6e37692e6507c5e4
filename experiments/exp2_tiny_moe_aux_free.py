"""exp2: auxiliary-loss-free expert balancing on the tutorial's tiny MoE.

Issue: #2 of the repository named by MARIN_ISSUE_REPO (e.g. MARIN_ISSUE_REPO=local/experiments for the local
tracker). The file name `exp2_<slug>.py` is the link: the executor infers the issue from it, so the script
needs no `issue=` argument (`--issue owner/repo#N` overrides it).

Hypothesis: replacing the tutorial model's load-balancing loss with DeepSeek-V3's per-expert router bias
(balance="aux_free") keeps held-out bits per byte within 0.02 of the aux-loss model on both domains, while
the experts' load (metrics.jsonl `expert_load`) is at least as even.

One knob changes; everything else is the tutorial's, by identity. The data steps are imported, not
re-declared, so they have the tutorial's hashes and output paths: after the tutorial has run, `marin plan`
on this script shows them (and the tutorial's own train and eval steps) as `skip`, and only the two new
steps run.

    MARIN_ISSUE_REPO=local/experiments python experiments/exp2_tiny_moe_aux_free.py
"""

from __future__ import annotations

import dataclasses

from experiments.tutorials.tiny_moe import TINY_MOE, tiny_moe, tiny_moe_eval
from marin import Criterion, Step, executor_main, output_path_of
from marin.status.console import ConsoleProgress
from operators.evaluate import evaluate
from operators.train import train

tiny_moe_aux_free = Step(
    name="train/tiny_moe-aux_free", fn=train, description="the tutorial model with aux-loss-free balancing",
    config=dataclasses.replace(tiny_moe.config, model={**TINY_MOE, "balance": "aux_free"}),
)

tiny_moe_aux_free_eval = Step(
    name="eval/tiny_moe-aux_free", fn=evaluate, description="per-domain bits per byte of the aux-free model",
    config=dataclasses.replace(tiny_moe_eval.config, checkpoint=output_path_of(tiny_moe_aux_free)),
)

# Non-inferiority on both domains: the aux-free model may be up to 0.02 bits per byte worse (min_effect
# -0.02).
# The expert-load half of the hypothesis has no single number yet (metrics.jsonl `expert_load` is a list per
# layer); the dashboard's routing charts show it.
NO_WORSE = [Criterion(metric=f"eval/tiny_moe-aux_free:domains.{domain}.bpb", better="lower",
                      baseline=tiny_moe_eval, min_effect=-0.02) for domain in ("python", "prose")]

if __name__ == "__main__":
    executor_main(steps=[tiny_moe_eval, tiny_moe_aux_free_eval],
                  description="exp2: aux-loss-free balancing vs the tutorial's aux loss",
                  criterion=NO_WORSE, tags=("moe", "balance"), publishers=[ConsoleProgress()])
