"""One small interface over the prefix's storage, with the guarantees each backend can give.

`LocalStorage` (plain paths, and `file://`) uses the OS directly because it is on every step's critical path:
atomic writes are a temporary file plus `os.replace`; exclusive create is `os.link` of a fully written
temporary file (so no reader ever sees a half-written lease); compare-and-swap runs under a thread lock plus a
POSIX record lock (`fcntl.lockf`) on the file itself, which the kernel releases if the process dies.

`FsspecStorage` covers object stores. Writes are single-object PUTs (atomic for readers). Conditional writes:
- `s3://`: create with `If-None-Match: *` (s3fs `mode="create"`), compare-and-swap and delete with `If-Match:
  <etag>` through the s3fs client; a lost race, or an object deleted meanwhile, is a clean refusal.
- `gs://`: create with `ifGenerationMatch=0` (gcsfs `mode="create"`); compare-and-swap and delete with
  `if_generation_match=<generation>` through google-cloud-storage when it is installed.
- anything else: best effort (check, then write); two executors can both win a race there, which the
  docs say plainly (docs/concepts.md, "Leases").
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import posixpath
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import fsspec

from marin.errors import StorageError

T = TypeVar("T")


def normalize_prefix(prefix: str) -> str:
    """Make a local prefix absolute (once, so status and data never end up in different places)."""
    if "://" in prefix and not prefix.startswith("file://"):
        return prefix.rstrip("/")
    path = prefix[len("file://") :] if prefix.startswith("file://") else prefix
    return os.path.abspath(os.path.expanduser(path))


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A file's text plus an opaque token that changes whenever the file is rewritten."""

    text: str
    token: Any


class Storage:
    """The operations the engine needs; paths are absolute (local paths or URLs)."""

    is_local: bool = False
    guarantees: str = ""

    def read_text(self, path: str) -> str | None:
        raise NotImplementedError

    def write_text(self, path: str, text: str) -> None:
        raise NotImplementedError

    def append_text(self, path: str, text: str) -> None:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str] | None:
        """Base names of the entries of a directory, or None when it does not exist."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def upload_file(self, local_path: str, path: str) -> None:
        raise NotImplementedError

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create `path` with `text` only if it does not exist; False if it already exists."""
        raise NotImplementedError

    def read_versioned(self, path: str) -> Versioned | None:
        raise NotImplementedError

    def replace_if(self, path: str, text: str, token: Any) -> bool:
        """Overwrite `path` only if it still has version `token`; False if someone else changed it."""
        raise NotImplementedError

    def delete_if(self, path: str, token: Any) -> bool:
        """Delete `path` only if it still has version `token`; False if someone else changed it."""
        raise NotImplementedError


# Temporary file names: unique per host-process-call without a urandom call per write (a forked child has its own
# pid, so sharing the token and the counter with its parent cannot collide).
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
    guarantees = "atomic replace, exclusive create (link), compare-and-swap under lockf: safe across processes"

    def __init__(self) -> None:
        # Directories known to exist: when a write finds its directory missing, only the levels below the
        # nearest known one are made (writes themselves try first and never consult this).
        self._dirs: set[str] = set()

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._dirs:
            return
        # Usually only the last levels are new (a step's output path and its .marin): make those directly below
        # the nearest directory known to exist, instead of os.makedirs' stat and failed mkdir per level.
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

    def _retrying(self, directory: str, action: Callable[[], T]) -> T:
        """Run `action`; if its directory is missing (new, or deleted behind our back to force a re-run), make it
        and run `action` once more. Trying first costs one failed call for a new directory and saves a `mkdir`
        per write where it exists, which is the common case (a worker writing into `.marin` its executor made)."""
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
        """Hold an exclusive lock on the file at `path` (yields its descriptor), or yield None if it is absent.

        Exclusive across threads (an in-process lock) and processes (a POSIX record lock, `fcntl.lockf`, on the
        file itself). A compare-and-swap replaces the file with a new one (a new inode) while holding the old
        one's lock, so after locking we check that `path` still names the locked file and start again if not:
        every locker ends up on the current file, and nobody replaces or deletes a file someone else holds.
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


class FsspecStorage(Storage):
    """Any fsspec filesystem; object stores get conditional writes where the protocol has them."""

    def __init__(self, fs: fsspec.AbstractFileSystem, protocol: str) -> None:
        self.fs = fs
        self.protocol = protocol
        self.guarantees = {
            "s3": "single-PUT writes; create If-None-Match; compare-and-swap/delete If-Match on the ETag",
            "gs": "single-PUT writes; create ifGenerationMatch=0; compare-and-swap/delete on the generation "
            "(needs google-cloud-storage)",
        }.get(protocol, "single-PUT writes; leases are best effort (check then write)")

    def read_text(self, path: str) -> str | None:
        try:
            return self.fs.cat_file(path).decode("utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        self.fs.pipe_file(path, text.encode("utf-8"))

    def append_text(self, path: str, text: str) -> None:
        # Object stores have no append: rewrite the whole (small) object.
        old = self.read_text(path) or ""
        self.write_text(path, old + text)

    def listdir(self, path: str) -> list[str] | None:
        try:
            entries = self.fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return None
        except TypeError:
            entries = self.fs.ls(path, detail=False)
        return [posixpath.basename(str(e).rstrip("/")) for e in entries]

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def upload_file(self, local_path: str, path: str) -> None:
        self.fs.put_file(local_path, path)

    def create_exclusive(self, path: str, text: str) -> bool:
        data = text.encode("utf-8")
        if self.protocol in ("s3", "gs", "gcs"):
            try:
                self.fs.pipe_file(path, data, mode="create")
                return True
            except FileExistsError:
                return False
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def _split(self, path: str) -> tuple[str, str]:
        bare = path.split("://", 1)[-1]
        bucket, _, key = bare.partition("/")
        return bucket, key

    def read_versioned(self, path: str) -> Versioned | None:
        if self.protocol == "s3":
            return self._s3_get_versioned(path)
        if self.protocol in ("gs", "gcs"):
            blob = _gcs_blob(path)
            if blob is not None:
                has_generations, found = _gcs_get_versioned(blob)
                if has_generations:
                    return found
            # no google-cloud-storage, or no generation (an emulator that does not report it): compare contents
        text = self.read_text(path)
        return None if text is None else Versioned(text, text)

    def _s3_get_versioned(self, path: str) -> Versioned | None:
        """Body and ETag from one GetObject, so the token always belongs to the text (reading them with two
        requests let a writer slip in between: a compare-and-swap on that ETag then overwrote a newer object
        with an update computed from the older text)."""
        from fsspec.asyn import sync

        bucket, key = self._split(path)

        async def get() -> tuple[bytes, Any]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            try:
                return await body.read(), response.get("ETag")
            finally:
                body.close()

        try:
            data, etag = sync(self.fs.loop, get)
        except FileNotFoundError:
            return None
        return Versioned(data.decode("utf-8"), etag)

    def _s3_if_match(self, operation: str, path: str, etag: Any, **kwargs: Any) -> bool:
        """An S3 put/delete that applies only while the object's ETag is still `etag`; False if it changed."""
        bucket, key = self._split(path)
        try:
            self.fs.call_s3(operation, Bucket=bucket, Key=key, IfMatch=etag, **kwargs)
        except FileNotFoundError:  # the object is gone (e.g. a lease its worker released): not our version
            return False
        except (PermissionError, OSError) as e:
            if _is_precondition_failure(e):
                return False
            raise
        self.fs.invalidate_cache(path)
        return True

    def replace_if(self, path: str, text: str, token: Any) -> bool:
        if self.protocol == "s3":
            return self._s3_if_match("put_object", path, token, Body=text.encode("utf-8"))
        if self.protocol in ("gs", "gcs") and isinstance(token, int):
            blob = _gcs_blob(path)
            if blob is not None:
                return _gcs_conditional(lambda: blob.upload_from_string(text, if_generation_match=token))
        current = self.read_text(path)
        if current != token:
            return False
        self.write_text(path, text)
        return True

    def delete_if(self, path: str, token: Any) -> bool:
        if self.protocol == "s3":
            return self._s3_if_match("delete_object", path, token)
        if self.protocol in ("gs", "gcs") and isinstance(token, int):
            blob = _gcs_blob(path)
            if blob is not None:
                return _gcs_conditional(lambda: blob.delete(if_generation_match=token))
        if self.read_text(path) != token:
            return False
        self.fs.rm_file(path)
        return True


def _is_precondition_failure(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error} {error.__cause__!r}"
    return "PreconditionFailed" in text or "412" in text


def _gcs_blob(path: str) -> Any:
    try:
        from google.cloud import storage as gcs
    except ImportError:  # gcsfs alone gives create-if-absent only; see the module docstring
        return None
    bare = path.split("://", 1)[-1]
    bucket, _, key = bare.partition("/")
    client = _GCS_CLIENTS.get("client")
    if client is None:
        client = gcs.Client() if not os.environ.get("STORAGE_EMULATOR_HOST") else gcs.Client.create_anonymous_client()
        _GCS_CLIENTS["client"] = client
    return client.bucket(bucket).blob(key)


_GCS_CLIENTS: dict[str, Any] = {}


def _gcs_get_versioned(blob: Any) -> tuple[bool, Versioned | None]:
    """(True, the object's text and generation) in two requests - metadata, then the body of that very
    generation - or (True, None) if it does not exist; (False, None) if the store reports no generation.
    Retried if the object changed in between."""
    from google.api_core import exceptions as gexc

    for _ in range(5):
        try:
            blob.reload()
        except gexc.NotFound:
            return True, None
        generation = blob.generation
        if not isinstance(generation, int):
            return False, None
        try:
            return True, Versioned(blob.download_as_bytes(if_generation_match=generation).decode("utf-8"),
                                   generation)
        except (gexc.PreconditionFailed, gexc.NotFound):  # rewritten or deleted since the metadata was read
            continue
    raise StorageError(f"{blob.name}: rewritten during every one of 5 reads; retry the operation")


def _gcs_conditional(action: Any) -> bool:
    from google.api_core import exceptions as gexc

    try:
        action()
        return True
    except (gexc.PreconditionFailed, gexc.NotFound):
        return False


_STORAGES: dict[str, Storage] = {}


def storage_for(prefix: str) -> Storage:
    """The Storage for a prefix (cached per protocol; fsspec caches filesystem instances itself)."""
    if "://" not in prefix or prefix.startswith("file://"):
        return _STORAGES.setdefault("file", LocalStorage())
    protocol = prefix.split("://", 1)[0]
    try:
        fs, _ = fsspec.core.url_to_fs(prefix)
    except (ImportError, ValueError) as e:
        raise StorageError(
            f"cannot open storage for prefix {prefix!r}: {e}. Install the fsspec backend for {protocol}:// "
            "(gcsfs for gs://, s3fs for s3://)"
        ) from e
    return FsspecStorage(fs, protocol)
