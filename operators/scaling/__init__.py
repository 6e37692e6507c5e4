"""Scaling ladders: fit a law to small runs, pre-register the big run's loss with an interval, score it after.

- :mod:`.fit` — ``fit_scaling_law`` (offset power law, Huber on log L, bootstrap interval, leave-one-out);
- :mod:`.surface` — the two-variable surface ``E + A/N^a + B/D^b`` and the compute-optimal allocation;
- :mod:`.inputs` — what the fitter refuses (too few budgets, non-finite or non-decreasing losses);
- :mod:`.rules` — per-rung shape, batch, learning rate and schedule from documented rules;
- :mod:`.ladder` — the plan of a ladder (rungs x seeds, learning-rate check, target) as plain data;
- :mod:`.curve` — the eval step: one held-out set at fixed fractions of a run's training;
- :mod:`.steps` — the fit, prediction, target-train and verdict step functions and their records.

Never imports ``marin``: experiments/common/scaling_ladder.py turns a plan into steps.
"""

from operators.scaling.bootstrap import IntervalMethod
from operators.scaling.fit import FORM_OFFSET, FORM_SURFACE, FitSettings, ScalingFit, fit_offset
from operators.scaling.inputs import LadderInputError
from operators.scaling.surface import SurfaceFit, compute_optimal, fit_surface

__all__ = [
    "FORM_OFFSET",
    "FORM_SURFACE",
    "FitSettings",
    "IntervalMethod",
    "LadderInputError",
    "ScalingFit",
    "SurfaceFit",
    "compute_optimal",
    "fit_offset",
    "fit_surface",
]
