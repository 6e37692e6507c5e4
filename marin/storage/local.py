"""Storage on a local (or NFS-mounted) filesystem, through the OS directly: it is on every step's critical
path.

Atomic writes are a temporary file plus `os.replace`; exclusive create is `os.link` of a fully written
temporary file (so no reader ever sees a half-written lease); compare-and-swap runs under a thread lock plus a
POSIX record lock (`fcntl.lockf`) on the file itself, which the kernel releases if the process dies. The
version token of a local file is its text (compared under the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import itertools
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from marin.storage.base import Storage, Versioned
from marin.storage.listing import CHUNK, FileInfo

T = TypeVar("T")


# Temporary file names: unique per host-process-call without a urandom call per write (a forked child has its
# own pid, so sharing the token and the counter with its parent cannot collide).
_TMP_TOKEN = uuid.uuid4().hex[:12]
_TMP_COUNTER = itertools.count()


def _new_thread_locks() -> list[threading.Lock]:
    return [threading.Lock() for _ in range(64)]  # striped by path; see LocalStorage._locked


_THREAD_LOCKS = _new_thread_locks()


def _fresh_thread_locks() -> None:
    # A fork copies locks held by other threads as held forever: the child starts with its own, free ones.
    global _THREAD_LOCKS
    _THREAD_LOCKS = _new_thread_locks()


os.register_at_fork(after_in_child=_fresh_thread_locks)


def _open_existing(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        return None


def _stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


class LocalStorage(Storage):
    is_local = True
    guarantees = (
        "atomic replace, exclusive create (link), compare-and-swap under lockf: safe across processes"
    )

    def __init__(self) -> None:
        # Directories known to exist: when a write finds its directory missing, only the levels below the
        # nearest known one are made (writes themselves try first and never consult this).
        self._dirs: set[str] = set()

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._dirs:
            return
        # Usually only the last levels are new (a step's output path and its .marin): make those directly
        # below the nearest directory known to exist, instead of os.makedirs' stat and failed mkdir per level.
        missing: list[str] = []
        known = directory
        while known not in self._dirs and len(missing) < 4:
            missing.append(known)
            parent = os.path.dirname(known)
            if parent == known:
                break
            known = parent
        if known not in self._dirs:  # nothing known close above it
            os.makedirs(directory, exist_ok=True)
        else:
            try:
                for d in reversed(missing):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(d)
            except FileNotFoundError:  # a known directory was removed behind our back
                self._dirs.clear()
                os.makedirs(directory, exist_ok=True)
        d = directory
        for _ in range(16):  # it and its ancestors exist now
            self._dirs.add(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent

    def read_text(self, path: str) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            return self._read_fd(fd)
        finally:
            os.close(fd)

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def move(self, path: str, to: str) -> None:
        os.replace(path, to)

    def _retrying(self, directory: str, action: Callable[[], T]) -> T:
        """Run `action`; if its directory is missing (new, or deleted behind our back to force a re-run),
        make it and run `action` once more. Trying first costs one failed call for a new directory and saves a
        `mkdir` per write where it exists, which is the common case (a worker writing into `.marin` its
        executor made)."""
        try:
            return action()
        except FileNotFoundError:
            self._dirs.discard(directory)
            self._ensure_dir(directory)
            return action()

    def _write_temporary(self, directory: str, text: str) -> str:
        """Write `text` to a fresh temporary file in `directory` (made if missing); return its path."""
        tmp = os.path.join(directory, f".tmp-{_TMP_TOKEN}-{os.getpid()}-{next(_TMP_COUNTER)}")
        data = text.encode("utf-8")

        def write() -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

        self._retrying(directory, write)
        return tmp

    def write_text(self, path: str, text: str) -> None:
        os.replace(self._write_temporary(os.path.dirname(path), text), path)

    def append_text(self, path: str, text: str) -> None:
        def append() -> None:
            # One write() of a line opened with O_APPEND lands whole, even with several writers.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)

        self._retrying(os.path.dirname(path), append)

    def listdir(self, path: str) -> list[str] | None:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def upload_file(self, local_path: str, path: str) -> None:
        if os.path.abspath(local_path) != os.path.abspath(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.replace(local_path, path)

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[int | None]:
        """Hold an exclusive lock on the file at `path` (yields its descriptor), or yield None if it is
        absent.

        Exclusive across threads (an in-process lock) and processes (a POSIX record lock, `fcntl.lockf`, on
        the file itself). A compare-and-swap replaces the file with a new one (a new inode) while holding the
        old one's lock, so after locking we check that `path` still names the locked file and start again if
        not: every locker ends up on the current file, and nobody replaces or deletes a file someone else
        holds.
        Locking the file itself rather than a side file leaves no lock file beside each lease and creates no
        file on the release path.

        Not `flock`: a flock belongs to the open file description, which a process forked while the lock is
        held (a local-backend worker) inherits, so the lock outlived its holder's `close` and every later
        locker hung. POSIX record locks are not inherited by fork, are released when the holder closes the
        file or dies, and also work on NFS; they do not exclude threads of one process, hence the thread lock.
        """
        with _THREAD_LOCKS[hash(path) % len(_THREAD_LOCKS)]:
            while True:
                fd = _open_existing(path, os.O_RDWR | os.O_CLOEXEC)
                if fd is None:
                    yield None
                    return
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX)
                    current = _stat_or_none(path)  # what `path` names now that we hold the lock
                    locked = os.fstat(fd)
                    if current is None or (current.st_ino, current.st_dev) == (locked.st_ino, locked.st_dev):
                        yield None if current is None else fd  # deleted while we waited: absent now
                        return
                    # replaced while we waited for its lock: lock the file that is there now
                finally:
                    os.close(fd)  # closing releases the record lock

    @staticmethod
    def _read_fd(fd: int) -> str:
        chunks = []
        offset = 0
        while chunk := os.pread(fd, 1 << 16, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode("utf-8")

    def create_exclusive(self, path: str, text: str) -> bool:
        tmp = self._write_temporary(os.path.dirname(path), text)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def read_versioned(self, path: str) -> Versioned | None:
        text = self.read_text(path)
        return None if text is None else Versioned(text, text)

    def replace_if(self, path: str, text: str, token: Any) -> bool:
        with self._locked(path) as fd:
            if fd is None or self._read_fd(fd) != token:
                return False
            self.write_text(path, text)
            return True

    def delete_if(self, path: str, token: Any) -> bool:
        with self._locked(path) as fd:
            if fd is None or self._read_fd(fd) != token:
                return False
            os.unlink(path)
            return True

    # ----- listings -------------------------------------------------------------------------------------
    def list_files(self, path: str, limit: int | None = None) -> dict[str, FileInfo] | None:
        if not os.path.isdir(path):
            return None
        out: dict[str, FileInfo] = {}
        stack = [""]
        while stack and (limit is None or len(out) <= limit):
            rel = stack.pop()
            with os.scandir(os.path.join(path, rel) if rel else path) as entries:
                for entry in entries:
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=True):
                        stack.append(name)
                    elif entry.is_file(follow_symlinks=True):
                        st = entry.stat(follow_symlinks=True)
                        out[name] = FileInfo(st.st_size, None, st.st_mtime_ns)
        return out

    def file_info(self, path: str) -> FileInfo | None:
        st = _stat_or_none(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        return FileInfo(st.st_size, None, st.st_mtime_ns)

    def glob_files(self, pattern: str) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        for p in sorted(glob.glob(pattern, recursive=True)):
            info = self.file_info(p)
            if info is not None:
                out[p] = info
        return out

    def iter_bytes(self, path: str) -> Iterator[bytes]:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
