"""The experiment script that ``marin issue new`` proposes for a fresh issue:
``experiments/exp<N>_<slug>.py``.

It follows the house habits for experiment scripts: a module docstring that links the issue and states the
hypothesis and its criterion, steps as flat declarations named for what they produce, no storage literals,
and ``executor_main`` at the end with the issue named explicitly. It is a real ablation that runs as
generated: the tutorial's data steps and baseline model reused by identity, one field of the train config
changed (the learning rate, halved), the changed model evaluated, and a criterion against the baseline. The
number ``N`` is chosen so that the script collides with no existing one (``next_number``).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from marin.tracking.base import Issue

MAX_SLUG = 40


def slugify(title: str) -> str:
    """``Try a 2x wider router!`` -> ``try_a_2x_wider_router`` (lowercase ASCII words joined by ``_``)."""
    words = re.findall(r"[a-z0-9]+", title.lower())
    slug = ""
    for word in words:
        candidate = f"{slug}_{word}" if slug else word
        if len(candidate) > MAX_SLUG:
            break
        slug = candidate
    return slug or (words[0][:MAX_SLUG] if words else "experiment")


def script_path(experiments_dir: Path, number: int, title: str) -> Path:
    return experiments_dir / f"exp{number}_{slugify(title)}.py"


def _hypothesis(body: str) -> str:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body.strip()) if p.strip()]
    fallback = "State what this experiment tries and what result would confirm it."
    text = paragraphs[0] if paragraphs else fallback
    text = re.sub(r"(?i)^hypothesis\s*:\s*", "", text)
    return textwrap.fill(" ".join(text.split()).replace('"""', "'''"), width=100)


def used_numbers(experiments_dir: Path) -> set[int]:
    """The issue numbers the scripts in `experiments_dir` are named after (`exp2_x.py`, `exp15/`)."""
    found = set()
    for entry in experiments_dir.iterdir() if experiments_dir.is_dir() else ():
        match = re.match(r"^exp(\d+)(?:_|$|\.py$)", entry.name)
        if match:
            found.add(int(match.group(1)))
    return found


def next_number(issue_numbers: set[int], experiments_dir: Path) -> int:
    """The smallest number above every issue of the repository that no experiment script uses yet, so that
    `exp<N>_<slug>.py` never collides with a shipped script (the local tracker numbers its issues so)."""
    n = max(issue_numbers, default=0) + 1
    taken = used_numbers(experiments_dir)
    while n in taken:
        n += 1
    return n


def script_skeleton(issue: Issue, script: str | None = None) -> str:
    """The source of the experiment script for `issue`: an ablation of the tutorial (one train field
    changed, evaluated like the baseline, a criterion against it); `script` is where it will be written."""
    title = " ".join(issue.title.split()).replace('"""', "'''")
    name = slugify(issue.title)
    script = script or f"experiments/exp{issue.number}_{name}.py"
    stem = Path(script).stem
    return f'''"""Experiment {issue.ref}: {title}

Issue: {issue.url}

Hypothesis: {_hypothesis(issue.body)}

Criterion: eval/tiny_moe-{name}:macro.bpb lower than eval/tiny_moe by at least 0.01
Tags: ablation

An ablation of the tutorial (experiments/tutorials/tiny_moe.py): its data steps and its model are imported,
so they keep their hashes and are reused (after the tutorial ran, `marin plan` shows them as `skip`); ONE
field of the train step's config changes (CHANGE below) and the new model is evaluated as the tutorial's is.
The criterion compares the two held-out bits per byte (lower is better; `by at least` is the smallest gain
that counts). Edit CHANGE, the hypothesis and the criterion, then:

    marin plan {script}         # the change, field by field, and what will run
    marin run {script}          # ends with every evaluated number and the verdict
    marin verdict {stem}        # the verdict and its history
"""

import dataclasses

from experiments.tutorials.tiny_moe import tiny_moe, tiny_moe_eval
from marin import Step, executor_main, output_path_of
from operators.evaluate import evaluate
from operators.train import train

# The one change: a TrainConfig field; here the trainer's learning rate (set through `overrides` by its
# dotted path in the trainer's config), halved from the tutorial's.
LR = tiny_moe.config.overrides["optimizer.lr"] / 2
CHANGE = {{"overrides": {{**tiny_moe.config.overrides, "optimizer.lr": LR}}}}

train_changed = Step(
    name="train/tiny_moe-{name}",
    fn=train,
    config=dataclasses.replace(tiny_moe.config, **CHANGE),
    description="the tutorial model with this experiment's change",
)

eval_changed = Step(
    name="eval/tiny_moe-{name}",
    fn=evaluate,
    config=dataclasses.replace(tiny_moe_eval.config, checkpoint=output_path_of(train_changed)),
    description="held-out bits per byte of the changed model",
)

if __name__ == "__main__":
    executor_main(steps=[tiny_moe_eval, eval_changed], description={title!r}, issue="{issue.ref}")
'''
