"""The local issue tracker's issues, read through the tracker's own read API (marin.tracking).

The local tracker keeps its issues in SQLite under `{prefix}/.marin-tracker/`; the dashboard only reads them.
Issue references that the local tracker does not know are linked to GitHub ('owner/repo#12').
"""

from __future__ import annotations

from marin.dashboard.experiments import github_issue_link
from marin.dashboard.schemas import Issue, IssueLink, IssueList
from marin.dashboard.store import PrefixStore


class IssueReader:
    def __init__(self, store: PrefixStore):
        self.store = store

    def available(self) -> bool:
        return False

    def list(self) -> IssueList:
        return IssueList(available=False, items=[])

    def get(self, number: int) -> Issue | None:
        return None

    def link(self, ref: str | None) -> IssueLink | None:
        return github_issue_link(ref)
