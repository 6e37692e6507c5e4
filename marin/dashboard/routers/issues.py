"""Issues of the local tracker, with their status comments (read-only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from marin.dashboard.context import Dashboard, get_dashboard, page
from marin.dashboard.schemas import Issue, IssueList

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]


@router.get("/api/issues", response_model=IssueList, tags=["issues"])
def list_issues(dash: Dash, state: Annotated[str, Query(pattern="^(open|closed|all)$")] = "all") -> IssueList:
    """Issues of the local tracker under this prefix, most recently updated first."""
    return dash.issues.list(state)


@router.get("/api/issues/{owner}/{name}/{number}", response_model=Issue, tags=["issues"])
def get_issue(owner: str, name: str, number: int, dash: Dash) -> Issue:
    """One local issue (`owner/name#number`) with its comments, the executor's status comment among them."""
    issue = dash.issues.get(f"{owner}/{name}", number)
    if issue is None:
        raise HTTPException(404, f"no issue {owner}/{name}#{number} in the local tracker under this prefix")
    return issue.model_copy(update={"experiments": dash.experiments.for_issue(issue.ref)})


@router.get("/issues", response_class=HTMLResponse, include_in_schema=False)
def issues_page(request: Request, dash: Dash) -> HTMLResponse:
    return page(
        request, "issues.html", {"prefix": dash.prefix, "issues": dash.issues.list()}
    )


@router.get("/issues/{owner}/{name}/{number}", response_class=HTMLResponse, include_in_schema=False)
def issue_page(owner: str, name: str, number: int, request: Request, dash: Dash) -> HTMLResponse:
    issue = get_issue(owner, name, number, dash)
    return page(
        request, "issue.html", {"prefix": dash.prefix, "issue": issue}
    )
