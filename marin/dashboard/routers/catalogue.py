"""The lab notebook on the dashboard: the catalogue of every experiment's hypothesis and verdict
(`/catalogue`, `/api/catalogue`, `/api/catalogue.md`) and one experiment's notebook
(`/api/experiments/{id}/notebook`, also shown on the experiment page).

Rows come from marin/status/catalogue.py, built from the experiment index's cached manifests and each
experiment's `verdicts.json`: `experiments/` is listed once per cache TTL and a verdicts file whose listed
signature (mtime, size...) is unchanged is served from the prefix store's cache, so a request over 1,000
experiments costs one listing, not 1,000 stats or reads. Every string is data:
the page escapes it (Jinja2 autoescape), the JSON returns it as is, the Markdown export escapes cells.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from marin.dashboard.context import Dashboard, get_dashboard, page
from marin.dashboard.paths import UnsafePathError
from marin.definition.criterion import OUTCOMES
from marin.errors import CorruptFileError
from marin.status import catalogue
from marin.status.manifest import EXPERIMENTS_DIR
from marin.status.verdicts import deciding

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]
Outcomes = Annotated[list[str] | None, Query(description=f"keep these outcomes: {', '.join(OUTCOMES)}")]
Tags = Annotated[list[str] | None, Query(description="keep experiments carrying every one of these tags")]


def verdicts_doc(dash: Dashboard, experiment_id: str,
                 listed: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The experiment's verdicts.json; with `listed` (the store's listing of experiments/), a file the
    listing does not name is absent and an unchanged one is served from the cache without a call."""
    rel = f"{EXPERIMENTS_DIR}/{experiment_id}/verdicts.json"
    if listed is not None and rel not in listed:
        return None
    try:
        doc = (dash.store.read_json(rel, info=listed[rel]) if listed is not None
               else dash.store.read_json_fetched(rel))  # one GET, there or not
    except (CorruptFileError, UnsafePathError, OSError):
        return None  # shown as not evaluated; the file itself is visible under /files
    return doc if isinstance(doc, dict) else None


def rows(dash: Dashboard, outcome: list[str] | None, tag: list[str] | None, sort: str = "date"
         ) -> list[catalogue.Row]:
    listed = dash.store.listing(EXPERIMENTS_DIR)  # one listing per cache TTL, not one call per experiment
    every = [catalogue.row(m, verdicts_doc(dash, str(m["id"]), listed)) for m in dash.experiments.manifests()
             if isinstance(m.get("id"), str)]
    wanted = [o for o in outcome or [] if o]
    try:
        found = catalogue.select(catalogue.newest_first(every), wanted, [t for t in tag or [] if t])
        return catalogue.by_speedup(found) if sort == "speedup" else found
    except ValueError as e:
        raise HTTPException(400, str(e)) from e


@router.get("/api/catalogue", tags=["notebook"])
def catalogue_json(dash: Dash, outcome: Outcomes = None, tag: Tags = None,
                   sort: Annotated[str, Query(pattern="^(date|speedup)$")] = "date") -> dict[str, Any]:
    """Every experiment with its hypothesis, outcome, deciding number, baseline and date; counts on top
    (``sort=speedup``: ideas by their compute-equivalent speedup first)."""
    return {"prefix": dash.prefix, **catalogue.to_json(rows(dash, outcome, tag, sort))}


@router.get("/api/catalogue.md", response_class=PlainTextResponse, tags=["notebook"])
def catalogue_markdown(dash: Dash, outcome: Outcomes = None, tag: Tags = None) -> PlainTextResponse:
    """The catalogue as a Markdown table, to paste into a report."""
    return PlainTextResponse(catalogue.markdown(rows(dash, outcome, tag)), media_type="text/markdown")


def notebook_view(dash: Dashboard, experiment_id: str) -> dict[str, Any]:
    """The experiment's frozen notebook, its current verdict (with the deciding number) and the history."""
    found = dash.experiments.manifest(experiment_id)
    manifest = found[0] if found else {}
    doc = verdicts_doc(dash, experiment_id) or {}
    current = doc.get("current") if isinstance(doc.get("current"), dict) else None
    history = [e for e in doc.get("history") or [] if isinstance(e, dict)]
    notebook = manifest.get("notebook") if isinstance(manifest.get("notebook"), dict) else None
    return {"notebook": notebook, "current": current, "history": history,
            "deciding": deciding(current, history) if current else "",
            "amendments": amendments(manifest, notebook)}


def amendments(manifest: dict[str, Any], notebook: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each amendment of the hypothesis/criterion (allowed until the first verdict: docs/notebook.md), oldest
    first: when, by which run, the text before (`previous`, as recorded) and after it (the next amendment's
    `previous`, or the notebook now)."""
    recorded = [a for a in manifest.get("notebook_amendments") or [] if isinstance(a, dict)]
    rows = []
    for i, amended in enumerate(recorded):
        after = recorded[i + 1].get("previous") if i + 1 < len(recorded) else notebook
        rows.append({"at": amended.get("at"), "run_id": amended.get("run_id"),
                     "previous": amended.get("previous") if isinstance(amended.get("previous"), dict) else {},
                     "new": after if isinstance(after, dict) else {}})
    return rows


@router.get("/api/experiments/{experiment_id}/notebook", tags=["notebook"])
def experiment_notebook(experiment_id: str, dash: Dash) -> dict[str, Any]:
    """One experiment's hypothesis, criteria, tags, current verdict and verdict history."""
    if dash.experiments.manifest(experiment_id) is None:
        raise HTTPException(404, f"no experiment {experiment_id!r} under the prefix")
    return notebook_view(dash, experiment_id)


@router.get("/catalogue", response_class=HTMLResponse, include_in_schema=False)
def catalogue_page(request: Request, dash: Dash, outcome: Outcomes = None, tag: Tags = None) -> HTMLResponse:
    shown = rows(dash, outcome, tag)
    by_tag = rows(dash, None, tag)  # the outcome badges count every outcome, so each is a useful filter
    query = urlencode([("outcome", o) for o in outcome or [] if o] + [("tag", t) for t in tag or [] if t])
    every_tag = sorted({t for m in dash.experiments.manifests() for t in
                        ((m.get("notebook") or {}).get("tags") or []) if isinstance(t, str)})
    return page(request, "catalogue.html", {
        "prefix": dash.prefix, "rows": shown, "headline": catalogue.headline(shown),
        "counts": catalogue.counts(by_tag), "outcomes": OUTCOMES, "words": catalogue.OUTCOME_WORDS,
        "selected": {"outcome": [o for o in outcome or [] if o], "tag": [t for t in tag or [] if t]},
        "tags": every_tag, "markdown_url": "/api/catalogue.md" + (f"?{query}" if query else ""),
        "api_url": "/api/catalogue" + (f"?{query}" if query else "")})
