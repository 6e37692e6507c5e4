"""The GitHub backend: PyGithub against api.github.com, GitHub Enterprise or any server at ``GITHUB_API_URL``.

PyGithub's own urllib3 retries are switched off (``retry=None``) so that one policy (:mod:`.retry`) decides
what is retried and for how long, and every failure comes out as a :class:`TrackerError` whose message was
passed through :func:`redact`. PyGithub follows the ``url`` fields of the objects it receives, so issue and
comment objects are cached by number/id: editing a comment found earlier costs one PATCH, not GET + PATCH.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import requests

from marin.tracking.base import (
    Comment,
    Issue,
    Tracker,
    TrackerAuthError,
    TrackerError,
    TrackerNotFound,
    TrackerUnavailable,
)
from marin.tracking.redact import redact, register_secret
from marin.tracking.retry import BackoffPolicy, Transient

if TYPE_CHECKING:
    from github.Issue import Issue as GhIssue
    from github.IssueComment import IssueComment as GhComment
    from github.Repository import Repository as GhRepository

T = TypeVar("T")
DEFAULT_API_URL = "https://api.github.com"
SECONDARY_RATE_LIMIT_WAIT_S = 60.0
_NETWORK_ERRORS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                   requests.exceptions.ChunkedEncodingError, http.client.HTTPException, ConnectionError,
                   TimeoutError)


def _ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def classify(exc: BaseException, now: Callable[[], float] = time.time) -> Transient | None:
    """Transient failures (network, 5xx, rate limits with their requested wait), or None."""
    from github.GithubException import GithubException, RateLimitExceededException

    if isinstance(exc, _NETWORK_ERRORS):
        return Transient(f"network error ({type(exc).__name__})")
    if not isinstance(exc, GithubException):
        return None
    status = exc.status
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    if status >= 500:
        return Transient(f"HTTP {status} from the server")
    rate_limited = status == 429 or (status == 403 and (
        isinstance(exc, RateLimitExceededException) or "retry-after" in headers
        or headers.get("x-ratelimit-remaining") == "0"))
    if not rate_limited:
        return None
    wait: float | None = None
    if headers.get("retry-after", "").strip().isdigit():
        wait = float(headers["retry-after"])
    elif headers.get("x-ratelimit-remaining") == "0" and headers.get("x-ratelimit-reset",
                                                                     "").strip().isdigit():
        wait = max(0.0, float(headers["x-ratelimit-reset"]) - now()) + 1.0  # the primary limit: until reset
    # a secondary limit (the reset header is the primary window's): GitHub asks to wait at least a minute
    else:
        wait = SECONDARY_RATE_LIMIT_WAIT_S
    return Transient(f"rate limited (HTTP {status})", wait)


def describe(exc: BaseException) -> str:
    """A one-line, redacted description of a PyGithub or network failure."""
    from github.GithubException import GithubException

    if isinstance(exc, GithubException):
        data = exc.data if isinstance(exc.data, dict) else {}
        return redact(f"HTTP {exc.status}: {data.get('message') or exc.message or 'no message'}")
    return redact(f"{type(exc).__name__}: {exc}")


class GitHubTracker(Tracker):
    """Issues of one GitHub repository, through PyGithub, with the retry policy of :mod:`.retry`."""

    kind = "github"

    def __init__(self, repo: str, token: str, *, api_url: str | None = None,
                 policy: BackoffPolicy | None = None, timeout_s: float = 15.0, throttle: bool = True) -> None:
        """``throttle=False`` drops PyGithub's pauses between requests (0.25 s, 1 s between writes), which
        GitHub asks clients to keep; tests against a local server turn them off."""
        from github import Auth, Github

        if not token:
            raise TrackerAuthError(f"GitHub tracker for {repo}: no token; set GITHUB_TOKEN or use the local "
                                   "tracker")
        register_secret(token)
        self.repo = repo
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        self.policy = policy or BackoffPolicy()
        pauses: dict[str, Any] = {} if throttle else {"seconds_between_requests": 0,
                                                      "seconds_between_writes": 0}
        self._gh = Github(auth=Auth.Token(token), base_url=self.api_url, retry=None, timeout=int(timeout_s),
                          **pauses)
        self._lock = threading.Lock()
        self._repo_obj: GhRepository | None = None
        self._issues: dict[int, GhIssue] = {}
        self._comments: dict[int, GhComment] = {}
        self._labels: dict[int, set[str]] = {}  # PyGithub does not update Issue.labels after label calls

    def __repr__(self) -> str:  # never show the client (it holds the token)
        return redact(f"GitHubTracker(repo={self.repo!r}, api_url={self.api_url!r})")

    def _call(self, what: str, fn: Callable[[], T], idempotent: bool = True) -> T:
        """Run one PyGithub call under the retry policy. A non-idempotent call (a POST that creates
        something) is not retried after a network error, since the server may have applied it: the caller
        decides (the publisher looks for its comment before creating it again)."""

        def classify_call(exc: BaseException) -> Transient | None:
            if not idempotent and isinstance(exc, _NETWORK_ERRORS):
                return None
            return classify(exc)

        def give_up(exc: BaseException, why: str) -> Exception:
            from github.GithubException import BadCredentialsException, GithubException

            msg = redact(f"GitHub {what} on {self.repo} ({self.api_url}) failed: {describe(exc)} [{why}]")
            if isinstance(exc, _NETWORK_ERRORS):
                ambiguous = "" if idempotent else "; the request may have been applied"
                return TrackerUnavailable(msg + ambiguous)
            if isinstance(exc, GithubException) and exc.status == 404:
                return TrackerNotFound(msg + "; check the repository/issue exists and the token can read it")
            if isinstance(exc, BadCredentialsException) or (
                    isinstance(exc, GithubException) and exc.status in (401, 403) and why == "not retryable"):
                return TrackerAuthError(msg + "; check GITHUB_TOKEN and its permissions (issues: write)")
            if why != "not retryable":
                return TrackerUnavailable(msg)
            return TrackerError(msg)

        return self.policy.run(fn, classify_call, give_up, abort=self.abort_event)

    def _repository(self) -> GhRepository:
        if self._repo_obj is None:
            self._repo_obj = self._call("get repository", lambda: self._gh.get_repo(self.repo))
        return self._repo_obj

    def _issue(self, number: int) -> GhIssue:
        if number not in self._issues:
            repo = self._repository()
            self._issues[number] = self._call(f"get issue #{number}", lambda: repo.get_issue(number))
        return self._issues[number]

    def _to_issue(self, gh: GhIssue) -> Issue:
        return Issue(repo=self.repo, number=gh.number, title=gh.title or "", body=gh.body or "",
                     state=gh.state, labels=tuple(sorted(label.name for label in gh.labels)),
                     url=gh.html_url, author=gh.user.login if gh.user else "", created=_ts(gh.created_at),
                     updated=_ts(gh.updated_at))

    def _to_comment(self, number: int, gh: GhComment) -> Comment:
        # html_url is read from the JSON received: an answer without it (GitHub's before 2013, as recorded in
        # PyGithub's ReplayData) would make PyGithub fetch every listed comment again just for the link
        sent = getattr(gh, "_rawData", None) or {}
        return Comment(id=gh.id, issue_number=number, body=gh.body or "",
                       author=gh.user.login if gh.user else "",
                       created=_ts(gh.created_at), updated=_ts(gh.updated_at), url=sent.get("html_url") or "")

    def get_issue(self, number: int) -> Issue:
        with self._lock:
            self._issues.pop(number, None)  # an explicit read refreshes the cache
            self._labels.pop(number, None)
            return self._to_issue(self._issue(number))

    def create_issue(self, title: str, body: str, labels: Sequence[str] = ()) -> Issue:
        with self._lock:
            repo = self._repository()
            # only the fields that are set, the request GitHub was recorded accepting (replay tests)
            extra: dict[str, Any] = {"body": redact(body)} if body else {}
            if labels:
                extra["labels"] = list(labels)
            gh = self._call("create issue", lambda: repo.create_issue(title=title, **extra), idempotent=False)
            self._issues[gh.number] = gh
            return self._to_issue(gh)

    def list_issues(self, state: str = "open") -> list[Issue]:
        with self._lock:
            repo = self._repository()
            # "open" is GitHub's default: the recorded listings send no state
            kwargs: dict[str, Any] = {} if state == "open" else {"state": state}
            found = self._call("list issues", lambda: list(repo.get_issues(**kwargs)))
            return [self._to_issue(gh) for gh in found]

    def list_comments(self, number: int) -> list[Comment]:
        with self._lock:
            issue = self._issue(number)
            found = self._call(f"list comments of #{number}", lambda: list(issue.get_comments()))
            for gh in found:
                self._comments[gh.id] = gh
            return [self._to_comment(number, gh) for gh in found]

    def create_comment(self, number: int, body: str) -> Comment:
        with self._lock:
            issue = self._issue(number)
            gh = self._call(f"comment on #{number}", lambda: issue.create_comment(redact(body)),
                            idempotent=False)
            self._comments[gh.id] = gh
            return self._to_comment(number, gh)

    def edit_comment(self, number: int, comment_id: int, body: str) -> Comment:
        with self._lock:
            gh = self._comments.get(comment_id)
            if gh is None:
                issue = self._issue(number)
                gh = self._call(f"get comment {comment_id}", lambda: issue.get_comment(comment_id))
                self._comments[comment_id] = gh
            target = gh
            self._call(f"edit comment {comment_id} on #{number}", lambda: target.edit(redact(body)))
            return self._to_comment(number, target)

    def delete_comment(self, number: int, comment_id: int) -> None:
        from github.GithubException import GithubException

        with self._lock:
            gh = self._comments.pop(comment_id, None)
            if gh is None:
                issue = self._issue(number)
                gh = self._call(f"get comment {comment_id}", lambda: issue.get_comment(comment_id))
            target = gh

            def delete() -> None:
                try:
                    target.delete()
                except GithubException as exc:
                    if exc.status != 404:  # 404: already deleted, the wanted end state
                        raise

            self._call(f"delete comment {comment_id} on #{number}", delete)

    def add_labels(self, number: int, labels: Sequence[str]) -> tuple[str, ...]:
        with self._lock:
            issue = self._issue(number)
            current = self._labels.setdefault(number, {x.name for x in issue.labels})
            self._call(f"label #{number}", lambda: issue.add_to_labels(*labels))
            current.update(labels)
            return tuple(sorted(current))

    def remove_label(self, number: int, label: str) -> tuple[str, ...]:
        from github.GithubException import GithubException

        with self._lock:
            issue = self._issue(number)

            def remove() -> None:
                # GitHub answers 404 "Label does not exist" when the label is not on the issue: the wanted
                # end state already holds (the issue itself was fetched, so the 404 is about the label)
                try:
                    issue.remove_from_labels(label)
                except GithubException as exc:
                    if exc.status != 404:
                        raise

            current = self._labels.setdefault(number, {x.name for x in issue.labels})
            self._call(f"unlabel #{number}", remove)
            current.discard(label)
            return tuple(sorted(current))

    def issue_url(self, number: int) -> str:
        cached = self._issues.get(number)
        if cached is not None:
            return cached.html_url
        default = self.api_url == DEFAULT_API_URL
        host = "https://github.com" if default else self.api_url.removesuffix("/api/v3")
        return f"{host}/{self.repo}/issues/{number}"
