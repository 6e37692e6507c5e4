"""The lab notebook's declaration: an experiment's hypothesis, the criterion that decides it, and its tags.

Declared at launch, with the steps (docs/notebook.md):

    executor_main(steps, hypothesis="aux-free balancing costs < 0.02 bpb",
                  criterion=Criterion(metric="eval/aux_free:macro.bpb", better="lower",
                                      baseline=tiny_moe_eval, min_effect=-0.02),
                  tags=("moe", "balance"))

or in the script's module docstring, in this form (the explicit arguments win, field by field):

    Hypothesis: one paragraph, up to the next blank line.
    Criterion: eval/aux_free:macro.bpb lower than eval/tiny_moe by at least -0.02
    Tags: moe, balance

A **metric** is `STEP:PATH`: a step of the experiment's DAG by name and a dotted path into what it wrote
(`eval.json` first, then the last row of `metrics.jsonl`; `FILE.json/PATH` picks another file). A
**baseline** is one of: a `Step` (the same PATH read from its output), a string that is a metric (`STEP:PATH`,
another number of this experiment), the name of a step of the DAG, another experiment's id (its recorded value
of the same metric), or a number (a fixed threshold). **effect** is the improvement in the `better`
direction (`baseline - value` for lower, `value - baseline` for higher); a criterion is met when
`effect >= min_effect`. A negative `min_effect` states a non-inferiority margin ("no worse by more than").

Everything is checked when built (`StepDefinitionError` naming the field and the fix); checks that need the
DAG (do the steps exist?) run in `marin/execution/notebook.py` before anything runs. This module does not
import the graph: a baseline `Step` stays an object here and is resolved to its hash there.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.definition.step import NAME_RE, Step
from marin.errors import StepDefinitionError

OUTCOMES = ("worked", "did_not_work", "mixed", "inconclusive", "not_evaluated", "infra_failure")
BETTER = ("lower", "higher")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,39}$")
MAX_HYPOTHESIS = 2000
_PATH_RE = re.compile(r"^(?:[A-Za-z0-9_.\-]+\.jsonl?/)?[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-:]+)*$")
_DOC_CRITERION = re.compile(
    r"^(?P<metric>\S+)\s+(?:is\s+)?(?P<better>lower|higher)\s+than\s+(?P<baseline>\S+)"
    r"(?:\s+by(?:\s+at\s+least)?\s+(?P<min>[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?))?\s*\.?$")

Baseline = Step | str | float | int


def _fail(what: str, value: Any, fix: str) -> StepDefinitionError:
    return StepDefinitionError(f"{what} = {value!r} is invalid: {fix}")


def split_metric(metric: str, what: str = "Criterion.metric") -> tuple[str, str]:
    """`"eval/tiny_moe:macro.bpb"` -> `("eval/tiny_moe", "macro.bpb")`, or a definition error."""
    if not isinstance(metric, str) or metric.count(":") < 1:
        raise _fail(what, metric, "write STEP:PATH, e.g. 'eval/tiny_moe:macro.bpb' (a step of the "
                                  "experiment, then a dotted path into its eval.json or metrics.jsonl)")
    step, path = metric.split(":", 1)
    if not NAME_RE.match(step) or not _PATH_RE.match(path):
        raise _fail(what, metric, "STEP must be a step name (letters, digits, '_', '-', '.', '/') and PATH a "
                                  "dotted path such as 'macro.bpb', 'domains.python.bpb', 'loss' or "
                                  "'choices.json/macro.accuracy'")
    return step, path


def is_metric(text: str) -> bool:
    return ":" in text


@dataclass(frozen=True)
class Criterion:
    """How the experiment's outcome is decided: `metric` compared with `baseline` in direction `better`."""

    metric: str
    """`STEP:PATH`, e.g. `eval/tiny_moe:macro.bpb` (see the module docstring)."""
    better: str
    """`lower` (losses, bits per byte) or `higher` (accuracy, throughput)."""
    baseline: Baseline
    """A Step, `STEP:PATH`, a step name, an experiment id, or a number."""
    min_effect: float = 0.0
    """The smallest improvement that counts as `worked` (in the metric's units; negative: a margin)."""

    def __post_init__(self) -> None:
        split_metric(self.metric)
        if self.better not in BETTER:
            raise _fail("Criterion.better", self.better, f"use one of {BETTER}")
        if isinstance(self.min_effect, bool) or not isinstance(self.min_effect, int | float) or \
                not math.isfinite(self.min_effect):
            raise _fail("Criterion.min_effect", self.min_effect, "give a finite number in the metric's units")
        self._check_baseline()

    def _check_baseline(self) -> None:
        b = self.baseline
        if isinstance(b, Step):
            return
        if isinstance(b, bool) or not isinstance(b, str | int | float):
            raise _fail("Criterion.baseline", b,
                        "give a Step, 'STEP:PATH', a step name, an experiment id or a number")
        if isinstance(b, int | float):
            if not math.isfinite(b):
                raise _fail("Criterion.baseline", b, "a fixed baseline must be a finite number")
            return
        if is_metric(b):
            split_metric(b, "Criterion.baseline")
        elif not b or not NAME_RE.match(b):
            raise _fail("Criterion.baseline", b, "name a step of the experiment, an experiment id such as "
                                                 "'exp2_tiny_moe_aux_free-0a1b2c3d', or 'STEP:PATH'")

    @property
    def step(self) -> str:
        return split_metric(self.metric)[0]

    @property
    def path(self) -> str:
        return split_metric(self.metric)[1]


@dataclass(frozen=True)
class Notebook:
    """What an experiment declares at launch: frozen into its manifest by the first run."""

    hypothesis: str = ""
    criteria: tuple[Criterion, ...] = ()
    tags: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.hypothesis, str) or len(self.hypothesis) > MAX_HYPOTHESIS:
            raise _fail("hypothesis", str(self.hypothesis)[:60], f"give one paragraph of text (at most "
                                                                 f"{MAX_HYPOTHESIS} characters)")
        for c in self.criteria:
            if not isinstance(c, Criterion):
                raise _fail("criterion", c, "give a Criterion(...) or a list of them")
        for t in self.tags:
            if not isinstance(t, str) or not TAG_RE.match(t):
                raise _fail("tags", t, "tags are short words: letters, digits, '_', '-', '.' (at most 40)")
        if self.criteria and not self.hypothesis.strip():
            raise _fail("hypothesis", self.hypothesis, "a criterion decides a hypothesis: state it, as "
                                                       "hypothesis='...' or a 'Hypothesis:' paragraph in the "
                                                       "script's docstring")

    @property
    def empty(self) -> bool:
        return not (self.hypothesis.strip() or self.criteria or self.tags)


def _criteria(value: Criterion | Sequence[Criterion] | None) -> tuple[Criterion, ...]:
    if value is None:
        return ()
    if isinstance(value, Criterion):
        return (value,)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _fail("criterion", value, "give a Criterion(...) or a list of them")
    return tuple(value)


def declare(hypothesis: str | None = None, criterion: Criterion | Sequence[Criterion] | None = None,
            tags: Sequence[str] | None = None, docstring: str | None = None) -> Notebook:
    """The notebook from `executor_main`'s arguments, each falling back to the script's docstring."""
    doc = parse_docstring(docstring or "")
    if isinstance(tags, str):
        raise _fail("tags", tags, "give a list of words, e.g. tags=('moe', 'balance')")
    return Notebook(
        hypothesis=" ".join(hypothesis.split()) if hypothesis is not None else doc.hypothesis,
        criteria=_criteria(criterion) if criterion is not None else doc.criteria,
        tags=tuple(tags) if tags is not None else doc.tags,
    )


def _paragraph(lines: list[str], start: int, first: str) -> str:
    parts = [first]
    for line in lines[start + 1:]:
        if not line.strip() or re.match(r"^\s*(Criterion|Tags|Hypothesis):", line):
            break
        parts.append(line.strip())
    return " ".join(" ".join(parts).split())


def parse_docstring(doc: str) -> Notebook:
    """`Hypothesis:` (a paragraph), `Criterion:` lines (`METRIC lower|higher than BASELINE [by [at least]
    N]`) and `Tags:` (comma-separated) from a module docstring."""
    lines = doc.splitlines()
    hypothesis, criteria, tags = "", [], tuple[str, ...]()
    for i, line in enumerate(lines):
        found = re.match(r"^\s*(Hypothesis|Criterion|Tags):\s*(.*)$", line)
        if not found:
            continue
        key, rest = found.group(1), found.group(2)
        if key == "Hypothesis" and not hypothesis:
            hypothesis = _paragraph(lines, i, rest)
        elif key == "Tags":
            tags = tuple(t.strip() for t in rest.split(",") if t.strip())
        elif key == "Criterion":
            criteria.append(_doc_criterion(rest.strip()))
    return Notebook(hypothesis=hypothesis, criteria=tuple(criteria), tags=tags)


def _doc_criterion(text: str) -> Criterion:
    found = _DOC_CRITERION.match(text)
    if not found:
        raise _fail("the docstring's Criterion line", text,
                    "write 'Criterion: STEP:PATH lower|higher than BASELINE [by at least N]', e.g. "
                    "'Criterion: eval/new:macro.bpb lower than eval/tiny_moe by at least 0.01'")
    baseline: Baseline = found.group("baseline")
    with contextlib.suppress(ValueError):
        baseline = float(str(baseline))
    return Criterion(metric=found.group("metric"), better=found.group("better"), baseline=baseline,
                     min_effect=float(found.group("min") or 0.0))
