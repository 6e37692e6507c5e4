"""One rendering path for the dashboard and the static site: the Jinja environment over
marin/dashboard/templates (autoescaped), without FastAPI, and the compare partials.

    from marin.compare import PrefixSource, compare
    from marin.compare.render import render_compare, environment
    html = render_compare(compare(PrefixSource(prefix), ["exp1", "exp2"]), log_y=False)   # an HTML fragment

Partials (all readable without JavaScript; hrefs come from `link`, a function step/experiment -> URL that
defaults to the dashboard's routes, so a static site passes its own relative links):
- `_line_chart.html`: one `LineChart` (marin/compare/charts.py) as inline SVG: `{% include %}` it with
  `chart` set;
- `_compare_table.html`: the metrics side by side with differences (`cmp`: a Comparison);
- `_config_diff.html`: the config differences of each run against the baseline (`cmp`);
- `_compare.html`: runs, charts, table and config diff together (`cmp`, `charts`, `link`).

The dashboard (marin/dashboard/app.py) builds its templates from `environment()` and adds its own filters
(Markdown, predictions); `static/compare.js` adds the hover read-out to any `svg.line-chart`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from marin.compare.charts import LineChart, fmt, line_chart
from marin.compare.comparison import Comparison

TEMPLATES = Path(__file__).resolve().parents[1] / "dashboard" / "templates"
STATES = {"WAITING", "RUNNING", "SUCCESS", "FAILED", "DEP_FAILED", "PREEMPTED", "NOT_STARTED", "NEVER_RUN"}
OUTCOME_CLASSES = {"worked", "did_not_work", "mixed", "inconclusive", "not_evaluated", "infra_failure"}


def _ts(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    s = float(value)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} m {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} m"


def _state(value: Any) -> str:
    return value if value in STATES else "UNKNOWN"


def _outcome(value: Any) -> str:
    """A verdict outcome as a CSS class suffix (whitelisted)."""
    return value if value in OUTCOME_CLASSES else "none"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _short(value: Any, n: int = 28) -> str:
    s = str(value)
    return s if len(s) <= n else s[: n // 2 - 1] + "…" + s[-(n // 2 - 1) :]


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return fmt(float(value))


def _signed(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return ("+" if value >= 0 else "−") + fmt(abs(float(value)))


def _value(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def environment() -> Environment:
    """The templates with every filter the partials use (ts, duration, state, outcome, pretty, short, num,
    signed, value)."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    env.filters.update(ts=_ts, duration=_duration, state=_state, outcome=_outcome, pretty=_pretty,
                       short=_short, num=_num, signed=_signed, value=_value)
    return env


_ENV: Environment | None = None


def _env() -> Environment:
    global _ENV
    if _ENV is None:
        _ENV = environment()
    return _ENV


def dashboard_link(kind: str, target: str) -> str:
    """The dashboard's URL of an experiment or a step (a static site passes its own `link`)."""
    from urllib.parse import quote

    return f"/experiments/{quote(target)}" if kind == "experiment" else f"/steps/{quote(target)}"


def charts_of(cmp: Comparison, *, log_x: bool = False, log_y: bool = False) -> list[LineChart]:
    return [line_chart(cs, log_x=log_x, log_y=log_y) for cs in cmp.curves]


def render_compare(cmp: Comparison, *, log_x: bool = False, log_y: bool = False,
                   link: Callable[[str, str], str] = dashboard_link,
                   env: Environment | None = None) -> Markup:
    """The compare partial (`_compare.html`) as an HTML fragment."""
    template = (env or _env()).get_template("_compare.html")
    return Markup(template.render(cmp=cmp, charts=charts_of(cmp, log_x=log_x, log_y=log_y), link=link))


def render_chart(chart: LineChart, env: Environment | None = None) -> Markup:
    return Markup((env or _env()).get_template("_line_chart.html").render(chart=chart))
