"""The rendered HTML of an experiment page's step graph and step table, reused while its steps are the same.

A 1,000-step experiment page spends most of its CPU rendering 1,000 table rows and 1,000 graph nodes (2,000
URL quotes, 1,000 timestamps, some 23,000 escapes). Both are a pure function of the page's steps as this
request read them (name, path, status, attempt, times, error, dependencies: `StepRef`; the graph is laid
out from them), so the HTML rendered from equal steps is reused. Nothing is served that this request did not
read: the key is what it has just read, validated against storage as every read is (within the store's
`ttl`); a step whose status changed changes the key and the page is rendered anew.

Bounded (`MAX_BYTES` of HTML, least recently used out first): a 1,000-step page is about 1 MB.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from markupsafe import Markup

from marin.dashboard.schemas import ExperimentDetail, StepRef

MAX_BYTES = 16 << 20

_Key = tuple[int, str]
_CACHE: OrderedDict[_Key, tuple[list[StepRef], dict[str, Markup], int]] = OrderedDict()
_LOCK = threading.Lock()
_SIZE = [0]


def experiment_fragments(env: Any, owner: object, detail: ExperimentDetail) -> dict[str, Markup]:
    """`{"dag": ..., "steps": ...}`: `_dag.html` of the detail's graph and `_steps_rows.html` of its steps,
    rendered with `env` (the app's Jinja environment), or reused from the last render of equal steps of this
    experiment (`owner`: the dashboard serving it)."""
    key = (id(owner), detail.id)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == detail.steps:
            _CACHE.move_to_end(key)
            return hit[1]
    html = {"dag": Markup(env.get_template("_dag.html").render(dag=detail.dag)),
            "steps": Markup(env.get_template("_steps_rows.html").render(steps=detail.steps))}
    size = sum(len(v) for v in html.values())
    with _LOCK:
        old = _CACHE.pop(key, None)
        _SIZE[0] -= old[2] if old else 0
        if size <= MAX_BYTES:
            _CACHE[key] = (list(detail.steps), html, size)
            _SIZE[0] += size
            while _SIZE[0] > MAX_BYTES:
                _, (_, _, dropped) = _CACHE.popitem(last=False)
                _SIZE[0] -= dropped
    return html
