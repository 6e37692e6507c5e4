"""The step counting and pairing of the Levanter comparison (benchmarks/step_pairing.py), on hook sequences
shaped like Levanter's: steps 0..N-1, then the last one again (its forced run of the hooks after training)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from step_pairing import first_per_step, kept, paired_ratios  # noqa: E402


def test_the_forced_last_hook_counts_once() -> None:
    hooks = [(s, float(s)) for s in range(6)] + [(5, 0.999)]  # step 5 seen again, with another value
    by_step = first_per_step(hooks)
    assert by_step == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0}  # the first stamp of step 5 only


def test_kept_drops_the_compiling_steps_and_outliers_by_number() -> None:
    durations = {0: 9.0, 1: 4.0, 2: 0.10, 3: 0.11, 4: 0.90, 5: 0.12}  # 4: a second compilation part-way
    assert kept(durations) == {2: 0.10, 3: 0.11, 5: 0.12}


def test_pairs_follow_step_numbers_across_a_dropped_outlier() -> None:
    levanter = kept({0: 9.0, 1: 4.0, 2: 0.5, 3: 0.75, 4: 4.0, 5: 0.5, 6: 0.75})
    assert list(levanter) == [2, 3, 5, 6]
    ours = {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25, 6: 0.375}
    # step 4 has no Levanter time: its pair is dropped, and 5 and 6 still meet their own steps
    assert paired_ratios(levanter, ours) == [2.0, 3.0, 2.0, 2.0]
    # pairing by position (what the harness did) would have put Levanter's step 5 against our step 4
    positional = [lev / o for lev, o in zip(levanter.values(), ours.values(), strict=False)]
    assert positional != paired_ratios(levanter, ours)


def test_a_step_only_one_side_timed_is_not_paired() -> None:
    assert paired_ratios({2: 1.0, 3: 1.0}, {3: 0.5, 4: 0.5}) == [2.0]
    assert paired_ratios({}, {2: 1.0}) == []
