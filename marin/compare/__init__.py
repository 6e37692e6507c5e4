"""Compare runs side by side: curves on shared axes, every final and eval metric with its difference from
the baseline (the first run), and the config difference field by field (docs/compare.md).

No web framework here: `marin compare` (marin/compare/cli.py), the dashboard's compare view and the static
site all call `compare(source, names, ...)` and render its `Comparison` (marin/compare/render.py for HTML with
inline SVG, `text.comparison_text()` for a terminal, `Comparison.to_json()` for scripts).

    from marin.compare import PrefixSource, compare
    c = compare(PrefixSource("/tmp/marin-out"), ["tiny_moe", "exp2"], metrics=["loss"], axis="tokens")
    c.rows[0].diffs   # each run's value minus the first run's

Modules: source.py (what is read: `Source`, `PrefixSource`, `Columns`), runs.py (names -> runs, own steps,
baselines), table.py (metrics side by side), curves.py (shared axes, smoothing, downsampling), configs.py
(step pairs and their differences), headline.py (an experiment's verdict and headline metrics), charts.py and
render.py (SVG geometry and the Jinja partials), text.py (the terminal table), comparison.py
(`compare` and `Comparison`).
"""

from __future__ import annotations

from marin.compare.comparison import Comparison, compare
from marin.compare.configs import StepPair
from marin.compare.curves import AXES, CurveSet
from marin.compare.headline import Headline, headline
from marin.compare.runs import CompareError, Run, baseline_of, owners, resolve
from marin.compare.source import Columns, PrefixSource, Source
from marin.compare.table import Row

__all__ = ["AXES", "Columns", "CompareError", "Comparison", "CurveSet", "Headline", "PrefixSource", "Row",
           "Run", "Source", "StepPair", "baseline_of", "compare", "headline", "owners", "resolve"]
