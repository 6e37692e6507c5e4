"""The experiment script that ``marin issue new`` proposes for a fresh issue:
``experiments/exp<N>_<slug>.py``.

It follows the house habits for experiment scripts (docs: GUIDE): a module docstring that links the issue and
states the hypothesis, steps as flat declarations named for what they produce, no storage literals, and
``executor_main`` at the end with the issue named explicitly. The starting steps reuse the hello-world
functions (write numbers, sum them), so the file runs as generated; the researcher replaces them with the
experiment's real steps.
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


def script_skeleton(issue: Issue) -> str:
    """The source of the experiment script for ``issue``."""
    title = " ".join(issue.title.split()).replace('"""', "'''")
    name = slugify(issue.title)
    return f'''"""Experiment {issue.ref}: {title}

Issue: {issue.url}

Hypothesis: {_hypothesis(issue.body)}
"""

from marin import Step, executor_main, output_path_of, this_output_path
from experiments.hello_world import SumConfig, WriteConfig, sum_numbers, write_numbers

numbers = Step(
    name="{name}/numbers",
    fn=write_numbers,
    config=WriteConfig(output_path=this_output_path(), n=10),
    description="the inputs of this experiment",
)

total = Step(
    name="{name}/total",
    fn=sum_numbers,
    config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"), output_path=this_output_path()),
    description="the result this experiment reports",
)

if __name__ == "__main__":
    executor_main(steps=[total], description={title!r}, issue="{issue.ref}")
'''
