"""Small multiple-choice tasks shipped with the code (built by ``python -m operators.tasks.build``).

Each task is a JSONL file of ``{"id", "context", "choices", "gold", "source"}`` rows; ``tasks.json`` records
the Python version whose standard library they were built from and each file's sha256. A task's name carries
a version suffix (``_v1``): a step's identity includes the names it evaluates, so a changed task gets a new
name.
"""

from __future__ import annotations

import json
from pathlib import Path

TASKS_DIR = Path(__file__).parent


def shipped_tasks() -> tuple[str, ...]:
    """Names of the shipped tasks."""
    with open(TASKS_DIR / "tasks.json") as f:
        return tuple(sorted(json.load(f)["tasks"]))


def task_path(name: str) -> str:
    """The JSONL file of a shipped task; ValueError listing the valid names otherwise."""
    if name not in shipped_tasks():
        raise ValueError(f"no shipped task named {name!r}: choose one of {', '.join(shipped_tasks())}, or "
                         "give the path of a JSONL file (context, choices, gold per line)")
    return str(TASKS_DIR / f"{name}.jsonl")


__all__ = ["TASKS_DIR", "shipped_tasks", "task_path"]
