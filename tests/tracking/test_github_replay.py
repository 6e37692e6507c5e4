"""GitHubTracker against real api.github.com answers (PyGithub's recordings), and the fake held against them.

Each tracker test serves the recordings of the endpoints one operation uses (tests/fakes/replay_github.py): a
request the tracker sends that GitHub was not recorded accepting (method, path, query, JSON body) fails the
test, and the values the tracker returns are checked against the recorded JSON. The comparison tests send the
recorded requests to tests/fakes/github_api.py and compare status, the fields the tracker reads and the
headers it relies on with GitHub's answers.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import requests

from marin.tracking.base import TrackerError, TrackerNotFound
from marin.tracking.github import SECONDARY_RATE_LIMIT_WAIT_S, GitHubTracker, classify
from marin.tracking.retry import BackoffPolicy
from tests.fakes.github_api import FakeGitHub
from tests.fakes.replay_github import Exchange, ReplayGitHub, replay_data
from tests.tracking.conftest import TOKEN, SleepRecorder

REPO = "PyGithub/PyGithub"
ISSUE = 28


def ts(iso: str) -> float:
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def recorded(exchanges: list[Exchange], method: str, path: str) -> Exchange:
    return next(x for x in exchanges if (x.method, x.path) == (method, path))


def tracker(server: ReplayGitHub, repo: str = REPO, sleeps: SleepRecorder | None = None) -> GitHubTracker:
    policy = BackoffPolicy(max_attempts=3, base_delay_s=0.5, sleep=sleeps or SleepRecorder())
    return GitHubTracker(repo, TOKEN, api_url=server.base_url, policy=policy, throttle=False, timeout_s=5)


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


def test_get_issue_reads_the_recorded_issue() -> None:
    data = replay_data("Issue.setUp")
    with ReplayGitHub(data) as server:
        issue = tracker(server).get_issue(ISSUE)
    real = recorded(data, "GET", f"/repos/{REPO}/issues/{ISSUE}").json()
    assert (issue.number, issue.title, issue.state) == (28, "Issue created by PyGithub", "closed")
    assert (issue.body, issue.author, issue.url) == (real["body"], "jacquev6",
                                                     "https://github.com/PyGithub/PyGithub/issues/28")
    assert issue.labels == ("bug", "question") == tuple(sorted(x["name"] for x in real["labels"]))
    assert (issue.created, issue.updated) == (ts("2012-05-19T10:38:23Z"), ts(real["updated_at"]))
    assert server.targets() == [f"GET /repos/{REPO}", f"GET /repos/{REPO}/issues/28"]
    assert all(s.authorization == f"token {TOKEN}" for s in server.served)


def test_create_comment_sends_the_recorded_request() -> None:
    with ReplayGitHub(replay_data("Issue.setUp", "Issue.testCreateComment")) as server:
        comment = tracker(server).create_comment(ISSUE, "Comment created by PyGithub")
    assert (comment.id, comment.issue_number, comment.body, comment.author) == (
        5808311, 28, "Comment created by PyGithub", "jacquev6")
    assert comment.created == comment.updated == ts("2012-05-20T11:46:42Z")
    assert server.served[-1].body == {"body": "Comment created by PyGithub"}
    assert server.served[-1].exchange is not None and server.served[-1].exchange.status == 201


def test_edit_of_a_comment_not_seen_before_fetches_then_patches() -> None:
    with ReplayGitHub(replay_data("IssueComment.setUp", "IssueComment.testEdit")) as server:
        edited = tracker(server).edit_comment(ISSUE, 20227753, "Comment edited by PyGithub")
    assert (edited.id, edited.body, edited.author) == (20227753, "Comment edited by PyGithub", "jacquev6")
    assert edited.updated == ts("2012-05-20T11:53:59Z")
    assert server.targets()[-2:] == [f"GET /repos/{REPO}/issues/comments/20227753",
                                     f"PATCH /repos/{REPO}/issues/comments/20227753"]


def test_delete_comment_accepts_the_recorded_204() -> None:
    with ReplayGitHub(replay_data("IssueComment.setUp", "IssueComment.testDelete")) as server:
        tracker(server).delete_comment(ISSUE, 20227753)
    last = server.served[-1]
    assert (last.method, last.exchange and last.exchange.status) == ("DELETE", 204)


def test_list_comments_reads_the_recorded_list() -> None:
    with ReplayGitHub(replay_data("Issue.setUp", "Issue.testGetComments")) as server:
        comments = tracker(server).list_comments(ISSUE)
    assert [(c.id, c.author) for c in comments] == [(5449237, "jacquev6"), (5518272, "roskakori")]
    assert comments[0].body.startswith("Thank you for the su") and comments[0].created == ts(
        "2012-05-01T22:03:59Z")


def test_list_issues_reads_the_recorded_listing() -> None:
    data = replay_data("Repository.setUp", "Repository.testGetIssues")
    with ReplayGitHub(data) as server:
        issues = tracker(server).list_issues()
    real = recorded(data, "GET", f"/repos/{REPO}/issues").json()
    assert [i.number for i in issues] == [x["number"] for x in real] and len(issues) == len(real) > 1
    assert [(i.title, i.state, i.author) for i in issues[:1]] == [(real[0]["title"], "open",
                                                                    real[0]["user"]["login"])]
    assert server.targets() == [f"GET /repos/{REPO}", f"GET /repos/{REPO}/issues"]  # state=open: the default


def test_the_issue_listing_follows_the_recorded_link_headers_across_14_pages() -> None:
    """The recorded pages carry only each issue's id (PyGithub's maintainers trimmed them), so this reads ids
    through the tracker's own client and repository call; the pages' Link headers are GitHub's."""
    data = replay_data("PaginatedList.setUp", "PaginatedList.testIteration")
    pages = [x for x in data if x.path.endswith("/issues")]
    assert len(pages) == 14 and 'rel="next"' in (pages[0].header("Link") or "")
    with ReplayGitHub(data) as server:
        repo = tracker(server, "openframeworks/openFrameworks")._repository()
        ids = [issue.id for issue in repo.get_issues()]
    assert ids == [x["id"] for page in pages for x in page.json()] and len(ids) == 333
    assert server.targets()[1:] == ["GET /repos/openframeworks/openFrameworks/issues"] + [
        f"GET /repos/openframeworks/openFrameworks/issues?page={n}" for n in range(2, 15)]


def test_create_issue_sends_the_recorded_request() -> None:
    with ReplayGitHub(replay_data("Repository.setUp", "Repository.testCreateIssue")) as server:
        issue = tracker(server).create_issue("Issue created by PyGithub", "")
    assert (issue.number, issue.title, issue.body, issue.state) == (28, "Issue created by PyGithub", "",
                                                                    "open")
    assert server.served[-1].body == {"title": "Issue created by PyGithub"}


def test_labels_are_added_and_removed_with_the_recorded_requests() -> None:
    data = replay_data("Issue.setUp", "Issue.testAddAndRemoveLabelsWithStringArguments")
    with ReplayGitHub(data) as server:
        gh = tracker(server)
        after_remove = gh.remove_label(ISSUE, "Bug")
        after_add = gh.add_labels(ISSUE, ["Bug", "Question"])
    assert server.targets()[-2:] == [f"DELETE /repos/{REPO}/issues/28/labels/Bug",
                                     f"POST /repos/{REPO}/issues/28/labels"]
    assert server.served[-1].body == ["Bug", "Question"]  # GitHub accepted the bare JSON list
    assert after_remove == ("bug", "question")  # the recordings are years apart: "Bug" is not "bug"
    assert after_add == ("Bug", "Question", "bug", "question")


def test_a_missing_repository_is_not_found_without_retrying(sleeps: SleepRecorder) -> None:
    with ReplayGitHub(replay_data("Exceptions.testUnknownObject")) as server, pytest.raises(
            TrackerNotFound, match=r"HTTP 404: Not Found.*check the repository"):
        tracker(server, "jacquev6/Xxx", sleeps).get_issue(1)
    assert sleeps.waits == [] and server.targets() == ["GET /repos/jacquev6/Xxx"]


def test_a_recorded_500_is_retried_then_the_recorded_success_is_read(sleeps: SleepRecorder) -> None:
    with ReplayGitHub(replay_data("Retry.testReturnsRepoAfter1Retry", "Issue.setUp")) as server:
        issue = tracker(server, sleeps=sleeps).get_issue(ISSUE)
    assert issue.number == 28 and len(sleeps.waits) == 1 and 0.5 <= sleeps.waits[0] <= 0.625
    assert [s.exchange.status for s in server.served if s.exchange] == [500, 200, 200]


def test_a_request_github_was_not_recorded_answering_fails_with_the_nearest_recording() -> None:
    with ReplayGitHub(replay_data("Issue.setUp", "Issue.testCreateComment")) as server:
        gh = tracker(server)
        with pytest.raises(TrackerError):
            gh.get_issue(29)
        with pytest.raises(TrackerError):
            gh.create_comment(ISSUE, "a body GitHub never saw")
        with pytest.raises(pytest.fail.Exception, match="requests GitHub was not recorded answering") as info:
            server.check()
        server.mismatches.clear()  # checked here; on exit they would fail the test
    message = str(info.value)
    assert (f"GET /repos/{REPO}/issues/29: no unused recording; nearest recorded request: "
            f"GET /repos/{REPO}/issues/28") in message
    assert '"a body GitHub never saw"' in message and "Issue.testCreateComment:1" in message


def _error(names: tuple[str, ...], call: str) -> Any:
    from github import Auth, Github
    from github.GithubException import GithubException

    with ReplayGitHub(replay_data(*names)) as server:
        gh = Github(auth=Auth.Token(TOKEN), base_url=server.base_url, retry=None, timeout=5,
                    seconds_between_requests=0, seconds_between_writes=0)
        with pytest.raises(GithubException) as info:
            if call == "user twice":
                for _ in range(2):
                    assert gh.get_user("jacquev6").login == "jacquev6"
            elif call == "search twice":
                for _ in range(2):
                    gh.search_code("jacquev6").get_page(0)
            elif call == "bad key":
                gh.get_user().create_key("Bad key", "xxx")
            elif call == "me":
                assert gh.get_user().login
    return info.value


@pytest.mark.parametrize(("names", "call", "status", "wait"), [
    (("SpecificExceptions.testRateLimitExceeded",), "user twice", 403, SECONDARY_RATE_LIMIT_WAIT_S),
    (("SpecificExceptions.testAuthenticatedRateLimitExceeded",), "search twice", 403, 60.0),
    (("Exceptions.testInvalidInput",), "bad key", 422, None),
    (("Exceptions.testBadAuthentication",), "me", 401, None),
], ids=["403-rate-limit", "403-retry-after", "422", "401"])
def test_recorded_errors_are_classified_as_the_policy_says(names: tuple[str, ...], call: str, status: int,
                                                           wait: float | None) -> None:
    exc = _error(names, call)
    assert exc.status == status
    transient = classify(exc)
    if wait is None:
        assert transient is None  # fails at once: retrying cannot fix it
    else:
        assert transient is not None and transient.wait_s == wait and "rate limited" in transient.reason


# -- the fake held against the recordings -----------------------------------------------------------------

ISSUE_FIELDS = {"number": int, "title": str, "state": str, "labels": list, "html_url": str, "url": str,
                "user.login": str, "created_at": str, "updated_at": str}
COMMENT_FIELDS = {"id": int, "body": str, "user.login": str, "created_at": str, "updated_at": str,
                  "html_url": str, "url": str}
LABEL_FIELDS: dict[str, type] = {"name": str, "url": str}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _get(obj: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        obj = obj[key]
    return obj


def differences(real: Exchange, status: int, headers: requests.structures.CaseInsensitiveDict[str],
                body: Any, fields: dict[str, type]) -> list[str]:
    """What a client of ours would notice between GitHub's recorded answer and the fake's."""
    out = []
    if status != real.status:
        out.append(f"status {status}, GitHub {real.status}")
    for name in ("ETag", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Content-Type"):
        if real.header(name) is not None and name not in headers:
            out.append(f"no {name} header (GitHub sends {real.header(name)!r})")
    if real.header("Content-Type") is None and real.body == "" and "Content-Type" in headers:
        out.append(f"Content-Type {headers['Content-Type']!r} on an empty answer (GitHub sends none)")
    real_body = real.json()
    items = list(zip(real_body, body, strict=False)) if isinstance(real_body, list) else [(real_body, body)]
    if isinstance(real_body, list) and (not isinstance(body, list) or (real_body and not body)):
        out.append(f"body {type(body).__name__}, GitHub a non-empty list")
    for want, got in items:
        if want is None:
            if got not in (None, ""):
                out.append(f"a body {got!r}, GitHub none")
            continue
        for name, kind in fields.items():
            try:
                _get(want, name)
            except (KeyError, TypeError):
                continue  # GitHub did not send it in this (old) recording: nothing to compare
            try:
                value = _get(got, name)
            except (KeyError, TypeError):
                out.append(f"field {name} missing")
                continue
            if not isinstance(value, kind) or not isinstance(_get(want, name), kind):
                out.append(f"field {name}: {type(value).__name__}, GitHub {type(_get(want, name)).__name__}")
            elif name.endswith("_at") and not ISO.match(str(value)):
                out.append(f"field {name}: {value!r} is not GitHub's ISO-8601 form")
    return out


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as server:
        for n in range(1, ISSUE + 1):
            server.add_issue(REPO, f"issue {n}", "body", labels=("bug", "question") if n == ISSUE else ())
        yield server


def ask(fake: FakeGitHub, method: str, path: str, body: Any = None, token: str = TOKEN
        ) -> tuple[int, requests.structures.CaseInsensitiveDict[str], Any]:
    answer = requests.request(method, fake.base_url + path, timeout=5,
                              headers={"Authorization": f"token {token}"},
                              data=None if body is None else json.dumps(body))
    return answer.status_code, answer.headers, answer.json() if answer.content else None


def _comment(fake: FakeGitHub) -> int:
    status, _, body = ask(fake, "POST", f"/repos/{REPO}/issues/{ISSUE}/comments", {"body": "x"})
    assert status == 201
    return int(body["id"])


CASES: dict[str, tuple[tuple[str, ...], str, str, dict[str, type]]] = {
    "get repo": (("Issue.setUp",), "GET", f"/repos/{REPO}", {"full_name": str, "url": str}),
    "get issue": (("Issue.setUp",), "GET", f"/repos/{REPO}/issues/{ISSUE}", ISSUE_FIELDS),
    "list comments": (("Issue.testGetComments",), "GET", f"/repos/{REPO}/issues/{ISSUE}/comments",
                      COMMENT_FIELDS),
    "create comment": (("Issue.testCreateComment",), "POST", f"/repos/{REPO}/issues/{ISSUE}/comments",
                       COMMENT_FIELDS),
    "get comment": (("IssueComment.setUp",), "GET", f"/repos/{REPO}/issues/comments/{{id}}", COMMENT_FIELDS),
    "edit comment": (("IssueComment.testEdit",), "PATCH", f"/repos/{REPO}/issues/comments/{{id}}",
                     COMMENT_FIELDS),
    "delete comment": (("IssueComment.testDelete",), "DELETE", f"/repos/{REPO}/issues/comments/{{id}}", {}),
    "create issue": (("Repository.testCreateIssue",), "POST", f"/repos/{REPO}/issues", ISSUE_FIELDS),
    "list issues": (("Repository.testGetIssues",), "GET", f"/repos/{REPO}/issues", ISSUE_FIELDS),
    "edit issue": (("Issue.testEditWithoutParameters",), "PATCH", f"/repos/{REPO}/issues/{ISSUE}",
                   ISSUE_FIELDS),
    "add labels": (("Issue.testAddAndRemoveLabelsWithStringArguments",), "POST",
                   f"/repos/{REPO}/issues/{ISSUE}/labels", LABEL_FIELDS),
    "remove label": (("Issue.testAddAndRemoveLabelsWithStringArguments",), "DELETE",
                     f"/repos/{REPO}/issues/{ISSUE}/labels/Bug", LABEL_FIELDS),
    "list labels": (("Issue.testAddAndRemoveLabelsWithStringArguments",), "GET",
                    f"/repos/{REPO}/issues/{ISSUE}/labels", LABEL_FIELDS),
    "missing repository": (("Exceptions.testUnknownObject",), "GET", "/repos/jacquev6/Xxx", {"message": str}),
    "get user": (("Exceptions.testUnknownObject",), "GET", "/user", {"login": str, "url": str}),
    "bad credentials": (("Exceptions.testBadAuthentication",), "GET", "/user", {"message": str}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fake_answers_as_github_did(fake: FakeGitHub, case: str) -> None:
    names, method, path, fields = CASES[case]
    real = next(x for x in replay_data(*names)
                if x.method == method and (x.path == path or "{id}" in path and x.path.startswith(
                    path.split("{id}")[0])))
    if case == "list comments":
        _comment(fake)
    if case == "remove label":
        ask(fake, "POST", f"/repos/{REPO}/issues/{ISSUE}/labels", ["Bug"])
    target = path.replace("{id}", str(_comment(fake))) if "{id}" in path else path
    token = "ghp_notthetoken0123456789" if case == "bad credentials" else TOKEN
    status, headers, body = ask(fake, method, target, json.loads(real.request_body) if real.request_body
                                else None, token)
    assert differences(real, status, headers, body, fields) == []
    if real.status >= 400:
        assert body["message"] == real.json()["message"]  # what describe() puts in the error


def test_the_fakes_link_headers_are_githubs(fake: FakeGitHub) -> None:
    """GitHub's pages name next and last, and after the first page also first and prev, adding only the page
    parameter to the query the client sent; the final page has no next. PyGithub follows next."""
    real = [x for x in replay_data("PaginatedList.testIteration") if x.path.endswith("/issues")]
    rels = [set(re.findall(r'rel="(\w+)"', x.header("Link") or "")) for x in real]
    assert rels[0] == {"next", "last"} and rels[1] == {"next", "last", "first", "prev"}
    assert "next" not in rels[-1] and {"first", "prev"} <= rels[-1]
    for i in range(90 - ISSUE):  # three pages of 30
        fake.add_issue(REPO, f"extra {i}")
    pages: list[set[str]] = []
    url: str | None = f"{fake.base_url}/repos/{REPO}/issues"
    while url:
        answer = requests.get(url, headers={"Authorization": f"token {TOKEN}"}, timeout=5)
        link = answer.headers.get("Link", "")
        pages.append(set(re.findall(r'rel="(\w+)"', link)))
        found = re.search(r'<([^>]+)>; rel="next"', link)
        if found:
            assert urllib.parse.parse_qs(urllib.parse.urlsplit(found.group(1)).query).keys() == {"page"}
        url = found.group(1) if found else None
    assert pages[:2] == rels[:2] and pages[2] == {"first", "prev"} and len(pages) == 3
