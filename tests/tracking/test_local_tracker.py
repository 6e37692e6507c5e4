"""LocalTracker: CRUD on the SQLite store under the prefix, read-only access, and object-store syncing."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import fsspec
import pytest

from marin.tracking.base import TrackerError, TrackerNotFound
from marin.tracking.local import LocalTracker


def test_crud(tmp_path: Path) -> None:
    tracker = LocalTracker(str(tmp_path))
    assert tracker.list_issues() == [] and tracker.list_repos() == []
    first = tracker.create_issue("Wider router", "Hypothesis: ...", labels=["experiment"])
    second = tracker.create_issue("Deeper model", "")
    assert (first.number, second.number, first.ref) == (1, 2, "local/experiments#1")
    assert first.labels == ("experiment",) and first.state == "open" and first.author
    assert (tmp_path / ".marin-tracker" / "tracker.sqlite3").is_file()
    comment = tracker.create_comment(1, "status v1")
    assert tracker.edit_comment(1, comment.id, "status v2").body == "status v2"
    tracker.create_comment(1, "a remark")
    assert [c.body for c in tracker.list_comments(1)] == ["status v2", "a remark"]
    tracker.delete_comment(1, comment.id)
    tracker.delete_comment(1, comment.id)  # already gone: fine
    assert [c.body for c in tracker.list_comments(1)] == ["a remark"]
    assert tracker.list_comments(2) == []
    assert tracker.add_labels(1, ["marin:running"]) == ("experiment", "marin:running")
    assert tracker.remove_label(1, "marin:running") == ("experiment",)
    assert tracker.remove_label(1, "absent") == ("experiment",)
    tracker.set_state(2, "closed")
    assert [i.number for i in tracker.list_issues()] == [1]
    assert [i.number for i in tracker.list_issues("all")] == [2, 1]
    assert [i.number for i in tracker.list_issues("closed")] == [2]
    assert tracker.get_issue(1).updated >= first.updated


def test_errors_name_what_is_missing(tmp_path: Path) -> None:
    tracker = LocalTracker(str(tmp_path))
    with pytest.raises(TrackerNotFound, match="local/experiments#3 not found"):
        tracker.get_issue(3)
    tracker.create_issue("x", "")
    with pytest.raises(TrackerNotFound, match="#1"):
        tracker.edit_comment(1, 12345, "nope")
    with pytest.raises(TrackerNotFound, match="local/experiments#7"):
        tracker.create_comment(7, "nope")
    with pytest.raises(TrackerError, match="already exists"):
        tracker.create_issue("dup", "", number=1)
    with pytest.raises(ValueError, match="non-empty title"):
        tracker.create_issue("  ", "")


def test_repos_are_separate_and_numbers_can_be_pinned(tmp_path: Path) -> None:
    LocalTracker(str(tmp_path)).create_issue("a", "")
    other = LocalTracker(str(tmp_path), repo="lab/moe")
    assert other.ensure_issue(12, "pinned", "b").number == 12
    assert other.ensure_issue(12, "ignored", "ignored").title == "pinned"  # idempotent
    assert other.create_issue("next", "").number == 13
    assert LocalTracker(str(tmp_path)).list_repos() == ["lab/moe", "local/experiments"]


def test_readonly_reader_sees_writes_and_cannot_write(tmp_path: Path) -> None:
    writer = LocalTracker(str(tmp_path))
    reader = LocalTracker(str(tmp_path), readonly=True)
    assert reader.list_issues() == []  # no store yet: empty, and nothing created
    assert not (tmp_path / ".marin-tracker").exists()
    writer.create_issue("x", "body")
    writer.create_comment(1, "hello")
    assert reader.get_issue(1).title == "x" and reader.list_comments(1)[0].body == "hello"
    with pytest.raises(TrackerError, match="read-only"):
        reader.create_comment(1, "no")


def test_concurrent_writers_from_threads_lose_nothing(tmp_path: Path) -> None:
    LocalTracker(str(tmp_path)).create_issue("x", "")

    def write(i: int) -> None:
        tracker = LocalTracker(str(tmp_path))
        for j in range(10):
            tracker.create_comment(1, f"{i}-{j}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(LocalTracker(str(tmp_path)).list_comments(1)) == 40


def test_dashboard_url_builds_issue_links(tmp_path: Path) -> None:
    tracker = LocalTracker(str(tmp_path), dashboard_url="http://127.0.0.1:8000/")
    issue = tracker.create_issue("x", "")
    assert issue.url == "http://127.0.0.1:8000/issues/local/experiments/1"
    assert LocalTracker(str(tmp_path)).issue_url(1) == "local:local/experiments#1"


def test_object_store_prefix_syncs_through_fsspec(tmp_path: Path) -> None:
    prefix = "memory://bucket-sync/prefix"
    alice = LocalTracker(prefix, cache_dir=tmp_path / "alice")
    bob = LocalTracker(prefix, cache_dir=tmp_path / "bob")
    alice.create_issue("from alice", "")
    remote = "memory://bucket-sync/prefix/.marin-tracker/tracker.sqlite3"
    assert fsspec.filesystem("memory").exists(remote)
    bob.create_comment(1, "bob was here")  # bob pulls alice's copy before writing
    alice.create_issue("alice again", "")  # alice pulls bob's comment before writing
    reader = LocalTracker(prefix, readonly=True, cache_dir=tmp_path / "carol")
    assert [i.title for i in reader.list_issues()] == ["alice again", "from alice"]
    assert [c.body for c in reader.list_comments(1)] == ["bob was here"]


def test_object_store_write_reapplied_when_the_remote_changed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = "memory://bucket-race/prefix"
    alice = LocalTracker(prefix, cache_dir=tmp_path / "alice")
    bob = LocalTracker(prefix, cache_dir=tmp_path / "bob")
    alice.create_issue("base", "")
    original = alice._transaction
    raced = []

    def racing_transaction(op):  # type: ignore[no-untyped-def]
        result = original(op)
        if not raced:  # bob uploads between alice's pull and alice's push
            raced.append(True)
            bob.create_comment(1, "bob's comment")
        return result

    monkeypatch.setattr(alice, "_transaction", racing_transaction)
    alice.create_comment(1, "alice's comment")
    bodies = sorted(c.body for c in LocalTracker(prefix, readonly=True,
                                                 cache_dir=tmp_path / "c").list_comments(1))
    assert bodies == ["alice's comment", "bob's comment"]


def test_store_is_plain_sqlite(tmp_path: Path) -> None:
    LocalTracker(str(tmp_path)).create_issue("x", "y")
    conn = sqlite3.connect(tmp_path / ".marin-tracker" / "tracker.sqlite3")
    assert conn.execute("SELECT title, body FROM issues").fetchall() == [("x", "y")]
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)
