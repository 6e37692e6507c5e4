"""What a step says it measures, and reading those numbers back: the engine's generic view of results.

The engine knows no tokens or models. A step's config class may declare, as class attributes (not fields:
they never enter identity),

    RESULT_METRICS: ClassVar[tuple[str, ...]] = ("eval.json/macro.bpb", "eval.json/domains.*.bpb", ...)
    HEADLINE_METRICS: ClassVar[tuple[str, ...]] = ("eval.json/macro.bpb", "eval.json/domains.*.bpb")

as `FILE/PATH` patterns: a JSON file (`.json`, or `.jsonl` for its last row) under the step's output path and
a dotted path into it, where `*` stands for one key that depends on the data (a domain, a task).

- `RESULT_METRICS` is every number the step writes that a criterion may use. `marin plan` and every run check
  each criterion's metric path (and a baseline's) against it before anything runs, and suggest the closest
  declared path for a typo. A step that declares nothing is not checked (its numbers are found at run time).
- `HEADLINE_METRICS` are the numbers a run's summary prints for the step when it ends (`read_headline`):
  each `*` is expanded against the file, and a number with a sibling `<key>_stderr` is printed `± stderr`.

The operators in `operators/` declare theirs (evaluate, evaluate_choices, train). Criterion paths follow the
lookup of marin/status/verdicts.py: `PATH` alone means `eval.json/PATH`, then `metrics.jsonl/PATH`.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from marin.definition.placeholders import join
from marin.status import files as sf
from marin.status.verdicts import last_row
from marin.storage.base import Storage

DEFAULT_FILES = ("eval.json", "metrics.jsonl")  # where a criterion's bare PATH is looked up, in order


def declared(config: Any, attribute: str = "RESULT_METRICS") -> tuple[str, ...]:
    """The patterns a config class declares under `attribute` (empty when it declares none)."""
    value = getattr(type(config), attribute, ())
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, tuple | list) else ()


def _split(pattern: str) -> tuple[str, list[str]]:
    file, _, path = pattern.partition("/")
    return file, path.split(".")


def matches(pattern: str, candidate: str) -> bool:
    """Whether `FILE/a.b.c` matches the pattern `FILE/a.*.c` (`*`: exactly one key)."""
    pf, pparts = _split(pattern)
    cf, cparts = _split(candidate)
    return pf == cf and len(pparts) == len(cparts) and all(p in ("*", c) for p, c in zip(pparts, cparts,
                                                                                          strict=True))


def candidates(path: str) -> list[str]:
    """The `FILE/PATH` forms a criterion's PATH may read (marin/status/verdicts.py's lookup order)."""
    head, _, rest = path.partition("/")
    if rest and head.endswith((".json", ".jsonl")):
        return [path]
    keys = [path] + ([path.replace("_", ".", 1)] if "_" in path and "." not in path else [])
    return [f"{name}/{key}" for key in keys for name in DEFAULT_FILES]


def check_path(patterns: tuple[str, ...], path: str) -> str | None:
    """None when `path` reads a declared number, else the closest declared path as it would be written."""
    if not patterns or any(matches(p, c) for p in patterns for c in candidates(path)):
        return None
    concrete = []
    for p in patterns:  # fill each `*` with the key the user wrote at that position, if any
        file, parts = _split(p)
        wrote = path.split("/", 1)[-1].split(".")
        filled = [w if k == "*" and i < len(wrote) else k for i, (k, w) in
                  enumerate(zip(parts, wrote + [""] * len(parts), strict=False))]
        short = ".".join(filled)
        concrete.append(short if file == DEFAULT_FILES[0] else f"{file}/{short}")
    close = difflib.get_close_matches(path, concrete, n=1, cutoff=0.5)
    return close[0] if close else concrete[0]


# ---- reading the headline numbers back ------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """One number a step reported: where it was read and its value (± stderr when the file gives one)."""

    file: str
    path: str
    value: float
    stderr: float | None = None

    def text(self) -> str:
        err = f" ± {self.stderr:.6g}" if self.stderr is not None else ""
        return f"{self.path} = {self.value:.6g}{err}"


def _last_row(output_path: str, name: str) -> dict[str, Any] | None:
    """The last training row of a JSONL file (no eval or alert row), as the verdicts read theirs."""
    return last_row(output_path, name, lambda row: "eval" not in row and "alert" not in row)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _expand(obj: Any, parts: list[str], done: list[str]) -> list[tuple[str, Any, Any]]:
    """(dotted path, value, its parent object) for every match of `parts` in `obj`."""
    if not parts:
        return [(".".join(done), obj, None)]
    if not isinstance(obj, dict):
        return []
    head, rest = parts[0], parts[1:]
    keys = sorted(obj) if head == "*" else [head] if head in obj else []
    out = []
    for key in keys:
        for path, value, parent in _expand(obj[key], rest, [*done, key]):
            out.append((path, value, parent if parent is not None else obj))
    return out


def read_headline(storage: Storage, output_path: str, patterns: tuple[str, ...]) -> list[Number]:
    """Every number of `patterns` found under `output_path` (see the module docstring)."""
    files: dict[str, Any] = {}
    numbers: list[Number] = []
    for pattern in patterns:
        file, parts = _split(pattern)
        if file not in files:
            files[file] = (_last_row(output_path, file) if file.endswith(".jsonl")
                           else sf.read_record(storage, join(output_path, file)))
        for path, value, parent in _expand(files[file], parts, []):
            number = _number(value)
            if number is None or not math.isfinite(number):
                continue
            key = path.rsplit(".", 1)[-1]
            stderr = _number(parent.get(f"{key}_stderr")) if isinstance(parent, dict) else None
            numbers.append(Number(file, path, number, stderr))
    return numbers
