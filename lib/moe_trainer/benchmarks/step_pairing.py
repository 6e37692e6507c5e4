"""Which steps `levanter_compare.py` times and pairs: pure functions, standard library only (the Levanter
side, `levanter_peer.py`, runs them in its own venv).

Levanter calls its step hooks after every step and then once more, forced, after the last one with that last
step's info (`Trainer.train`: `self.run_hooks(info, force=True)`), so a hook sees the last step twice.
Counting hook calls (or keeping every stamp) times that step twice and runs one extra step of ours for it.
Here every step is keyed by Levanter's step number: a repeated number is dropped (`first_per_step`), the
first steps (compilation) and outliers are dropped by number (`kept`), and ours is paired with Levanter's by
that number (`paired_ratios`), never by position in two lists that were filtered differently (an outlier
dropped from Levanter's list shifted every later pair by one step).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

UNTIMED_STEPS = 2
"""Levanter's first steps compile; neither side's step is timed against them."""
OUTLIER_FACTOR = 3.0
"""A Levanter step slower than this many times the median is dropped (it compiles a second step variant
part-way)."""


def first_per_step(stamps: Iterable[tuple[int, float]]) -> dict[int, float]:
    """{step: value} from (step, value) pairs in the order seen; a repeated step keeps its first value."""
    out: dict[int, float] = {}
    for step, value in stamps:
        out.setdefault(int(step), float(value))
    return out


def kept(durations: dict[int, float], untimed: int = UNTIMED_STEPS,
         outlier_factor: float = OUTLIER_FACTOR) -> dict[int, float]:
    """The timed steps: numbers >= ``untimed``, without those over ``outlier_factor`` x their median."""
    timed = {s: d for s, d in durations.items() if s >= untimed}
    if not timed:
        return {}
    limit = outlier_factor * statistics.median(timed.values())
    return {s: d for s, d in sorted(timed.items()) if d <= limit}


def paired_ratios(levanter: dict[int, float], ours: dict[int, float]) -> list[float]:
    """Levanter's step time / ours, for every step number both sides kept, in step order."""
    return [levanter[s] / ours[s] for s in sorted(levanter.keys() & ours.keys())]
