"""The local tracker: issues and comments in one SQLite file under the prefix, needing no account or network.

The store lives at ``{prefix}/.marin-tracker/tracker.sqlite3`` and may hold several repositories (the default
is ``local/experiments``). Every operation opens its own connection, so threads and processes can share the
file; writes take SQLite's write lock up front (``BEGIN IMMEDIATE``) and wait up to 30 s for it.

Object-store prefixes (``gs://``, ``s3://``): SQLite needs a real file, so the database is kept in a local
cache directory and synced through fsspec: each write pulls the remote copy when its fingerprint
(``fs.ukey``) changed, applies the operation in a transaction, checks the remote fingerprint again and then
uploads; if another writer uploaded in between, it pulls their copy and re-applies the operation (up to 5
times). What remains is a window of one fingerprint check plus one upload in which two writers on different
machines can overwrite each other's change (object stores offer no compare-and-swap through fsspec); status
comments heal at their next edit, a lost ``marin issue new`` does not. Readers pull when the remote changed.

Read API used by the dashboard: :meth:`LocalTracker.list_issues`, :meth:`LocalTracker.get_issue`,
:meth:`LocalTracker.list_comments`, :meth:`LocalTracker.list_repos` (open it with ``readonly=True``).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin.tracking.base import Comment, Issue, Tracker, TrackerError, TrackerNotFound
from marin.tracking.redact import redact

T = TypeVar("T")
DEFAULT_LOCAL_REPO = "local/experiments"
TRACKER_DIR = ".marin-tracker"
DB_NAME = "tracker.sqlite3"
SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS issues (
    repo TEXT NOT NULL, number INTEGER NOT NULL, title TEXT NOT NULL, body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'open', author TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (repo, number));
CREATE TABLE IF NOT EXISTS labels (
    repo TEXT NOT NULL, number INTEGER NOT NULL, name TEXT NOT NULL, PRIMARY KEY (repo, number, name));
CREATE TABLE IF NOT EXISTS comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, number INTEGER NOT NULL, body TEXT NOT NULL,
    author TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS comments_by_issue ON comments (repo, number, id);
"""


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): fall back to the uid
        return f"uid{os.getuid()}"


def _readonly_uri(path: Path) -> str:
    """SQLite's read-only `file:` URI of `path`, percent-escaped (UTF-8) so that a `#`, `?` or `%` in a
    prefix stays part of the path instead of starting the fragment or the query (or an escape)."""
    return f"file:{urllib.parse.quote(str(path.absolute()), safe='/')}?mode=ro"


def default_cache_dir() -> Path:
    return Path(os.environ.get("MARIN_CACHE_DIR", Path.home() / ".cache" / "marin")) / "tracker"


class _RemoteCopy:
    """A local working copy of the remote database file, synced through fsspec (see the module docstring)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, remote: str, local: Path) -> None:
        self.fs, self.remote, self.local = fs, remote, local
        self._ukey: str | None = None

    def remote_key(self) -> str | None:
        self.fs.invalidate_cache(self.remote)
        return self.fs.ukey(self.remote) if self.fs.exists(self.remote) else None

    def pull(self) -> None:
        key = self.remote_key()
        if key is None or (key == self._ukey and self.local.exists()):
            return
        tmp = self.local.with_suffix(".download")
        self.fs.get(self.remote, str(tmp))
        os.replace(tmp, self.local)
        self._ukey = key

    def push(self) -> None:
        self.fs.makedirs(self.remote.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put(str(self.local), self.remote)
        self._ukey = self.remote_key()

    @property
    def synced_key(self) -> str | None:
        return self._ukey


class LocalTracker(Tracker):
    """Issues of one repository in the SQLite store under ``prefix``."""

    kind = "local"

    def __init__(self, prefix: str, repo: str = DEFAULT_LOCAL_REPO, *, readonly: bool = False,
                 cache_dir: Path | None = None, dashboard_url: str | None = None) -> None:
        self.prefix, self.repo, self.readonly = prefix.rstrip("/"), repo, readonly
        url = dashboard_url or os.environ.get("MARIN_DASHBOARD_URL") or ""
        self.dashboard_url = url.rstrip("/") or None
        fs, root = fsspec.core.url_to_fs(self.prefix)
        remote_path = f"{root.rstrip('/')}/{TRACKER_DIR}/{DB_NAME}"
        self._remote: _RemoteCopy | None = None
        if isinstance(fs, LocalFileSystem):
            self.path = Path(remote_path)
        else:
            key = hashlib.sha256(self.prefix.encode()).hexdigest()[:16]
            local_dir = (cache_dir or default_cache_dir()) / key
            local_dir.mkdir(parents=True, exist_ok=True)
            self.path = local_dir / DB_NAME
            self._remote = _RemoteCopy(fs, remote_path, self.path)

    def __repr__(self) -> str:
        return f"LocalTracker(prefix={self.prefix!r}, repo={self.repo!r})"

    # -- storage -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _process_lock(self) -> Iterator[None]:
        """Serialise syncs of a cached copy between processes of this machine."""
        if self._remote is None:
            yield
            return
        with open(self.path.with_suffix(".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _connect(self, readonly: bool) -> sqlite3.Connection:
        if readonly:
            # a URI: every character of the path that means something in one (`#`, `?`, `%`) escaped
            conn = sqlite3.connect(_readonly_uri(self.path), uri=True, timeout=30)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        conn.row_factory = sqlite3.Row
        return conn

    def _read(self, op: Callable[[sqlite3.Connection], T], empty: T) -> T:
        with self._process_lock():
            if self._remote is not None:
                self._remote.pull()
            if not self.path.exists():
                return empty
            conn = self._connect(readonly=True)
            try:
                return op(conn)
            finally:
                conn.close()

    def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self.readonly:
            raise TrackerError(f"local tracker at {self.path} was opened read-only; open it without "
                               "readonly=True")
        with self._process_lock():
            for _ in range(5):
                if self._remote is not None:
                    self._remote.pull()
                before = self._remote.synced_key if self._remote is not None else None
                result = self._transaction(op)
                if self._remote is None:
                    return result
                if self._remote.remote_key() == before:
                    self._remote.push()
                    return result
                # another writer uploaded since our pull: drop our copy and re-apply on theirs
                self._remote.pull()
            raise TrackerError(f"local tracker {self.prefix}: the remote store kept changing during 5 write "
                               f"attempts; retry the operation")

    def _transaction(self, op: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connect(readonly=False)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = op(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()

    # -- rows -> values ------------------------------------------------------------------------------------

    def _issue_from(self, conn: sqlite3.Connection, row: sqlite3.Row) -> Issue:
        labels = conn.execute("SELECT name FROM labels WHERE repo=? AND number=? ORDER BY name",
                              (row["repo"], row["number"])).fetchall()
        return Issue(repo=row["repo"], number=row["number"], title=row["title"], body=row["body"],
                     state=row["state"], labels=tuple(r["name"] for r in labels),
                     url=self.issue_url(row["number"]), author=row["author"], created=row["created"],
                     updated=row["updated"])

    def _comment_from(self, row: sqlite3.Row) -> Comment:
        return Comment(id=row["id"], issue_number=row["number"], body=row["body"], author=row["author"],
                       created=row["created"], updated=row["updated"],
                       url=f"{self.issue_url(row['number'])}#comment-{row['id']}")

    def _require_issue(self, conn: sqlite3.Connection, number: int) -> sqlite3.Row:
        query = "SELECT * FROM issues WHERE repo=? AND number=?"
        row: sqlite3.Row | None = conn.execute(query, (self.repo, number)).fetchone()
        if row is None:
            raise TrackerNotFound(f"issue {self.repo}#{number} not found in the local tracker at "
                                  f"{self.path}; "
                                  f"`marin issue list --prefix {self.prefix}` shows the existing ones")
        return row

    def _touch(self, conn: sqlite3.Connection, number: int) -> None:
        conn.execute("UPDATE issues SET updated=? WHERE repo=? AND number=?",
                     (time.time(), self.repo, number))

    # -- the Tracker interface -----------------------------------------------------------------------------

    def get_issue(self, number: int) -> Issue:
        def op(conn: sqlite3.Connection) -> Issue:
            return self._issue_from(conn, self._require_issue(conn, number))

        found = self._read(op, empty=None)
        if found is None:
            raise TrackerNotFound(f"issue {self.repo}#{number} not found: no local tracker at {self.path} "
                                  "yet")
        return found

    def create_issue(self, title: str, body: str, labels: Sequence[str] = (),
                     number: int | None = None) -> Issue:
        """Open an issue; ``number`` pins its number (the publisher re-creates a referenced local issue that
        a fresh prefix lacks), otherwise it is one more than the largest number in the repository."""
        if not title.strip():
            raise ValueError("an issue needs a non-empty title")

        def op(conn: sqlite3.Connection) -> Issue:
            n = number
            if n is None:
                n = conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM issues WHERE repo=?",
                                 (self.repo,)).fetchone()[0]
            now = time.time()
            try:
                conn.execute("INSERT INTO issues VALUES (?, ?, ?, ?, 'open', ?, ?, ?)",
                             (self.repo, n, title, redact(body), _user(), now, now))
            except sqlite3.IntegrityError:
                raise TrackerError(f"issue {self.repo}#{n} already exists in {self.path}") from None
            conn.executemany("INSERT OR IGNORE INTO labels VALUES (?, ?, ?)",
                             [(self.repo, n, x) for x in labels])
            return self._issue_from(conn, self._require_issue(conn, n))

        return self._write(op)

    def ensure_issue(self, number: int, title: str, body: str) -> Issue:
        """Issue ``number``, created with this title/body if the store lacks it (idempotent)."""
        def op(conn: sqlite3.Connection) -> Issue:
            if conn.execute("SELECT 1 FROM issues WHERE repo=? AND number=?",
                            (self.repo, number)).fetchone() is None:
                now = time.time()
                conn.execute("INSERT INTO issues VALUES (?, ?, ?, ?, 'open', ?, ?, ?)",
                             (self.repo, number, title, redact(body), _user(), now, now))
            return self._issue_from(conn, self._require_issue(conn, number))

        return self._write(op)

    def list_issues(self, state: str = "open") -> list[Issue]:
        if state not in ("open", "closed", "all"):
            raise ValueError(f"state must be one of open, closed, all; got {state!r}")

        def op(conn: sqlite3.Connection) -> list[Issue]:
            rows = conn.execute("SELECT * FROM issues WHERE repo=? AND (?='all' OR state=?) ORDER BY number "
                                "DESC",
                                (self.repo, state, state)).fetchall()
            return [self._issue_from(conn, row) for row in rows]

        return self._read(op, empty=[])

    def exists(self) -> bool:
        """Whether the store has been created under the prefix (a read of a missing one finds nothing)."""
        if self._remote is not None:
            return self._remote.remote_key() is not None
        return self.path.exists()

    def list_repos(self) -> list[str]:
        """Every repository that has issues in this store."""
        return self._read(lambda conn: [r[0] for r in conn.execute("SELECT DISTINCT repo FROM issues ORDER "
                                                                   "BY repo")],
                          empty=[])

    def set_state(self, number: int, state: str) -> Issue:
        """Close or reopen an issue."""
        if state not in ("open", "closed"):
            raise ValueError(f"state must be open or closed; got {state!r}")

        def op(conn: sqlite3.Connection) -> Issue:
            self._require_issue(conn, number)
            conn.execute("UPDATE issues SET state=? WHERE repo=? AND number=?", (state, self.repo, number))
            self._touch(conn, number)
            return self._issue_from(conn, self._require_issue(conn, number))

        return self._write(op)

    def list_comments(self, number: int) -> list[Comment]:
        def op(conn: sqlite3.Connection) -> list[Comment]:
            self._require_issue(conn, number)
            rows = conn.execute("SELECT * FROM comments WHERE repo=? AND number=? ORDER BY id",
                                (self.repo, number)).fetchall()
            return [self._comment_from(row) for row in rows]

        return self._read(op, empty=[])

    def create_comment(self, number: int, body: str) -> Comment:
        def op(conn: sqlite3.Connection) -> Comment:
            self._require_issue(conn, number)
            now = time.time()
            cur = conn.execute("INSERT INTO comments (repo, number, body, author, created, updated) "
                               "VALUES (?, ?, ?, ?, ?, ?)",
                               (self.repo, number, redact(body), _user(), now, now))
            self._touch(conn, number)
            return self._comment_from(conn.execute("SELECT * FROM comments WHERE id=?",
                                                   (cur.lastrowid,)).fetchone())

        return self._write(op)

    def edit_comment(self, number: int, comment_id: int, body: str) -> Comment:
        def op(conn: sqlite3.Connection) -> Comment:
            cur = conn.execute("UPDATE comments SET body=?, updated=? WHERE id=? AND repo=? AND number=?",
                               (redact(body), time.time(), comment_id, self.repo, number))
            if cur.rowcount == 0:
                raise TrackerNotFound(f"comment {comment_id} on {self.repo}#{number} not found in "
                                      f"{self.path}")
            self._touch(conn, number)
            return self._comment_from(conn.execute("SELECT * FROM comments WHERE id=?",
                                                   (comment_id,)).fetchone())

        return self._write(op)

    def delete_comment(self, number: int, comment_id: int) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM comments WHERE id=? AND repo=? AND number=?",
                         (comment_id, self.repo, number))

        self._write(op)

    def add_labels(self, number: int, labels: Sequence[str]) -> tuple[str, ...]:
        def op(conn: sqlite3.Connection) -> tuple[str, ...]:
            self._require_issue(conn, number)
            conn.executemany("INSERT OR IGNORE INTO labels VALUES (?, ?, ?)",
                             [(self.repo, number, x) for x in labels])
            self._touch(conn, number)
            return self._labels(conn, number)

        return self._write(op)

    def remove_label(self, number: int, label: str) -> tuple[str, ...]:
        def op(conn: sqlite3.Connection) -> tuple[str, ...]:
            self._require_issue(conn, number)
            conn.execute("DELETE FROM labels WHERE repo=? AND number=? AND name=?",
                         (self.repo, number, label))
            return self._labels(conn, number)

        return self._write(op)

    def _labels(self, conn: sqlite3.Connection, number: int) -> tuple[str, ...]:
        rows: list[Any] = conn.execute("SELECT name FROM labels WHERE repo=? AND number=? ORDER BY name",
                                       (self.repo, number)).fetchall()
        return tuple(r[0] for r in rows)

    def issue_url(self, number: int) -> str:
        if self.dashboard_url:
            return f"{self.dashboard_url}/issues/{self.repo}/{number}"
        return f"local:{self.repo}#{number}"

