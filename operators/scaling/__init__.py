"""Scaling ladders: fit a law to small runs, pre-register the big run's loss with an interval, score it after.

- :mod:`.fit` — ``fit_offset`` and ``FitSettings``: the offset power law in C (Huber on log L, bootstrap
  interval, leave-one-out);
- :mod:`.surface` — ``fit_surface``: the two-variable surface ``E + A/N^a + B/D^b`` and the compute-optimal
  allocation;
- :mod:`.bootstrap` — the noise model and the interval both forms share (``IntervalMethod``);
- :mod:`.model_error` — the model-error term: the law's own extrapolation error, backtested on the ladder;
- :mod:`.inputs` — what the fitter refuses (too few budgets, non-finite or non-decreasing losses);
- :mod:`.calibrate` — fixing E from a family's earlier rung runs and scored targets;
- :mod:`.rules` — per-rung shape, batch, learning rate and schedule from documented rules;
- :mod:`.ladder` — the plan of a ladder (rungs x seeds, learning-rate check, target) as plain data;
- :mod:`.curve` — the eval step: one held-out set at fixed fractions of a run's training;
- :mod:`.band` — the prediction record as a health rule: an alert when a target evaluation leaves its band;
- :mod:`.fitstep` — the fit step: one law per evaluated fraction, written as fit.json;
- :mod:`.end_rule` — the ``pre_decay_anchor`` end rule: the end from the point before it and the late fall;
- :mod:`.gates` — every gate that flags a forecast before the target runs, one typed Gate;
- :mod:`.lrcheck` — the learning-rate check at the target: was the rule's rate the best one there;
- :mod:`.prediction` — the prediction step;
- :mod:`.target` — the target-train steps;
- :mod:`.verdict` — the verdict step.

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
