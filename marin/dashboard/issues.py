"""The local issue tracker's issues and their status comments, read through the tracker's read API.

The local tracker (marin.tracking.local) keeps issues of one or more repositories in SQLite at
`{prefix}/.marin-tracker/tracker.sqlite3`. The dashboard opens it read-only and caches what it read until the
database file's signature (mtime/size, or etag on object stores) changes. References that the local tracker
holds ('local/experiments#3', or 'owner/repo#12' when no GitHub token was configured) link to the dashboard's
own issue page; other well-formed 'owner/repo#N' references link to GitHub.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from marin.dashboard.experiments import github_issue_link
from marin.dashboard.schemas import Issue, IssueComment, IssueLink, IssueList
from marin.dashboard.store import PrefixStore, signature

DB = ".marin-tracker/tracker.sqlite3"


def _tracker_cls() -> Any:
    # Imported when a tracker exists: the dashboard must start on prefixes that never had one.
    from marin.tracking.local import LocalTracker

    return LocalTracker


class IssueReader:
    def __init__(self, store: PrefixStore):
        self.store = store
        self._lock = threading.Lock()
        self._checked = -1e18
        self._signature: Any = None
        self._issues: dict[tuple[str, int], Issue] = {}

    def _load(self) -> dict[tuple[str, int], Issue]:
        if time.monotonic() - self._checked < self.store.ttl:
            return self._issues
        with self._lock:
            info = self.store.info(DB)
            sig = signature(info) if info is not None else None
            if sig != self._signature:
                self._issues = self._read_all() if info is not None else {}
                self._signature = sig
            self._checked = time.monotonic()
            return self._issues

    def _read_all(self) -> dict[tuple[str, int], Issue]:
        cls = _tracker_cls()
        out: dict[tuple[str, int], Issue] = {}
        for repo in cls(self.store.prefix, readonly=True).list_repos():
            tracker = cls(self.store.prefix, repo, readonly=True)
            for issue in tracker.list_issues("all"):
                comments = [
                    IssueComment(id=c.id, body=c.body, created=c.created, updated=c.updated, author=c.author)
                    for c in tracker.list_comments(issue.number)
                ]
                out[(repo, issue.number)] = Issue(
                    repo=repo,
                    number=issue.number,
                    ref=issue.ref,
                    title=issue.title,
                    body=issue.body,
                    state=issue.state,
                    labels=list(issue.labels),
                    author=issue.author,
                    created=issue.created,
                    updated=issue.updated,
                    comments=comments,
                    url=f"/issues/{repo}/{issue.number}",
                )
        return out

    def available(self) -> bool:
        return self.store.info(DB) is not None

    def list(self, state: str = "all") -> IssueList:
        issues = list(self._load().values())
        if state != "all":
            issues = [i for i in issues if i.state == state]
        issues.sort(key=lambda i: (i.updated or 0, i.repo, i.number), reverse=True)
        return IssueList(available=self.available(), items=issues)

    def get(self, repo: str, number: int) -> Issue | None:
        return self._load().get((repo, number))

    def link(self, ref: str | None) -> IssueLink | None:
        if not ref:
            return None
        repo, _, number = ref.rpartition("#")
        if number.isdigit() and (repo, int(number)) in self._load():
            return IssueLink(ref=ref, url=f"/issues/{repo}/{int(number)}", local=True)
        return github_issue_link(ref)
