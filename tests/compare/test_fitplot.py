"""The scaling ladder's fit plot: a fit.json in the fit step's format and a real prediction record
(tests/fakes/records_v1/prediction-law.json) give the rung runs, the law, the target's interval and forecast
and the actual value, in pixel coordinates that put each where its numbers say; rendered by the shared
partial as inline SVG."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from marin.compare.fitplot import fit_chart
from marin.compare.render import environment

RECORD = Path(__file__).resolve().parents[1] / "fakes" / "records_v1" / "prediction-law.json"


def fit_doc(params: dict[str, float]) -> dict[str, Any]:
    def law(c: float) -> float:
        return params["E"] + params["A"] * c ** -params["alpha"]

    runs = [{"rung": f"d{k}", "seed": s, "lr_multiple": 1.0, "compute_6nd": c,
             "values": {"0.5": law(c / 2), "1": law(c) * (1 + 0.01 * s)}}
            for k, c in enumerate((1e10, 1e11, 1e12)) for s in (0, 1)]
    runs.append({"rung": "d2-lrx2", "seed": 0, "lr_multiple": 2.0, "compute_6nd": 1e12, "values": {"1": 9.0}})
    return {"fractions": [{"fraction": 0.5, "fit": {"params": {"E": 1, "A": 1, "alpha": 1}}},
                          {"fraction": 1.0, "fit": {"params": params}}], "runs": runs}


def test_fit_plot_places_runs_law_interval_target_and_actual() -> None:
    prediction = json.loads(RECORD.read_text())
    end = prediction["points"][-1]
    chart = fit_chart(fit_doc(end["params"]), prediction, actual=1.47)
    assert chart is not None
    assert len(chart.runs) == 6  # the learning-rate check run is not a rung of the law
    assert chart.target is not None and chart.actual is not None
    x, y_point, y_low, y_high, title = chart.target
    assert y_high < y_point < y_low  # SVG y grows downwards: high above the point above low
    assert f"{end['point']:.4g}" in title and f"{end['low']:.4g}" in title
    law = [tuple(map(float, p.split(","))) for p in chart.law.split()]
    nearest = min(law, key=lambda p: abs(p[0] - x))
    assert abs(nearest[1] - y_point) < 3  # the end forecast lies on the law (the 'law' end rule)
    assert chart.actual[0] == x and y_high < chart.actual[1] < y_low  # 1.47 is inside the interval
    run_x = sorted({round(r[0], 1) for r in chart.runs})
    assert len(run_x) == 3 and run_x[-1] < x  # three budgets, all left of the target
    decades = [float(label) for _, label in chart.x_ticks]
    assert len(decades) >= 3 and all(abs(math.log10(v) - round(math.log10(v))) < 1e-9 for v in decades)
    assert f"{end['params']['alpha']:.4g}" in chart.law_text


def test_fit_plot_renders_as_inline_svg() -> None:
    prediction = json.loads(RECORD.read_text())
    chart = fit_chart(fit_doc(prediction["points"][-1]["params"]), prediction)
    html = environment().get_template("_fit_chart.html").render(fit=chart)
    assert html.count('<circle class="run"') == 6 and '<polyline class="law"' in html
    assert '<line class="interval"' in html and '<circle class="actual"' not in html
    assert re.search(r'<circle class="forecast" cx="[\d.]+" cy="[\d.]+"', html)


def test_no_plot_without_an_end_law_or_runs() -> None:
    assert fit_chart({"fractions": [], "runs": []}) is None
    doc = fit_doc({"E": 1.0, "A": 2.0, "alpha": 0.1})
    assert fit_chart({**doc, "runs": []}) is None
    only_fit = fit_chart(doc)
    assert only_fit is not None and only_fit.target is None and only_fit.actual is None
    assert all(math.isfinite(float(v)) for p in only_fit.law.split() for v in p.split(","))
    with pytest.raises(AssertionError):
        assert fit_chart({"fractions": [{"fraction": 1.0, "fit": {"params": {"E": 1}}}], "runs": []})
