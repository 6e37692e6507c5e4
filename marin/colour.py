"""Colour for terminal output: only when the stream is a terminal, and never when `NO_COLOR` is set
(https://no-color.org: any non-empty value). Status and verdict words get one colour each, the same
everywhere (`marin status`, the run's progress and summary, `marin verdict`)."""

from __future__ import annotations

import os
import sys
from typing import TextIO

_CODES = {"green": "32", "red": "31", "yellow": "33", "dim": "2", "bold": "1"}
WORD_COLOURS = {
    "SUCCESS": "green", "SKIPPED": "dim", "RUNNING": "yellow", "WAITING": "dim", "FAILED": "red",
    "DEP_FAILED": "red", "PREEMPTED": "yellow", "worked": "green", "did_not_work": "red", "mixed": "yellow",
    "inconclusive": "yellow", "not_evaluated": "dim", "infra_failure": "red",
}


def enabled(stream: TextIO | None = None) -> bool:
    """Whether to colour text written to `stream` (default stdout)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream or sys.stdout, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def paint(text: str, colour: str, stream: TextIO | None = None) -> str:
    """`text` in `colour` (green, red, yellow, dim, bold) when `stream` takes colour, else unchanged."""
    if colour not in _CODES or not enabled(stream):
        return text
    return f"\033[{_CODES[colour]}m{text}\033[0m"


def word(text: str, stream: TextIO | None = None, key: str | None = None) -> str:
    """A status or verdict word (`SUCCESS`, `did_not_work`) in its colour; `key` when `text` is padded."""
    colour = WORD_COLOURS.get(key or text.strip())
    return paint(text, colour, stream) if colour else text
