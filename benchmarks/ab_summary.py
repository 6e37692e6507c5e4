"""Summarise alternating before/after runs of a JSON benchmark (benchmarks/executor_ab.sh writes them):
per figure, the median before, the median after and the median of the pairs' after/before ratios."""

from __future__ import annotations

import glob
import json
import statistics
import sys
from collections.abc import Iterator
from typing import Any


def flat(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, prefix + k + ".")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield prefix + k, float(v)


def summary(out: str) -> dict[str, dict[str, float | int]]:
    rows: dict[str, dict[str, list[float]]] = {}
    for side in ("before", "after"):
        for f in sorted(glob.glob(f"{out}/{side}-*.json")):
            with open(f) as fh:
                for k, v in flat(json.load(fh)):
                    rows.setdefault(k, {}).setdefault(side, []).append(v)
    result: dict[str, dict[str, float | int]] = {}
    for k, sides in rows.items():
        if k.startswith("machine.") or len(sides) < 2:
            continue
        pairs = [a / b for b, a in zip(sides["before"], sides["after"], strict=False) if b]
        result[k] = {"before_median": round(statistics.median(sides["before"]), 4),
                     "after_median": round(statistics.median(sides["after"]), 4), "pairs": len(pairs)}
        if pairs:
            result[k]["after_over_before"] = round(statistics.median(pairs), 3)
    return result


if __name__ == "__main__":
    print(json.dumps(summary(sys.argv[1]), indent=1))
