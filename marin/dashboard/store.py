"""Read-only access to a prefix through fsspec, with a small cache keyed on file signatures.

The dashboard never writes. Every read goes through :class:`PrefixStore`, which
- resolves the prefix once (`fsspec.core.url_to_fs`: local paths, `gs://`, `s3://`, `memory://` alike);
- takes only cleaned relative paths (see :mod:`marin.dashboard.paths`) and, on local storage, refuses any path
  whose real location (symlinks followed) is outside the prefix;
- caches parsed JSON / JSONL per file. An entry is trusted for `ttl` seconds without touching storage; after
  that one `info()` call compares the file's signature (mtime, size, inode, etag or generation — whatever the
  backend reports) and the file is re-read only when it changed. With 1,000 experiments most requests are
  served from memory and a refresh costs one stat per file that the request needs.
- lists a directory tree once per `ttl` (`listing`): a view over many small files (the catalogue's verdicts)
  passes each file's listed signature to `read_json`, so an unchanged file costs no call of its own;
- reads many small files in a few calls (`read_json_many`: an experiment page's status.json of every step):
  entries still fresh from memory, the rest checked against one recursive listing of a parent directory that
  holds mostly them (only the files asked for: on GCS a `matchGlob`, marin/storage/gcs.py `gcs_find`), and
  what changed read in one concurrent batch (`Storage.read_many`);
- shares, within one request (`one_request`), what the request already checked against the store, so an
  experiment page can make its independent reads at once beforehand (marin/dashboard/read_ahead.py) and
  then find them; nothing checked before the request is trusted longer than `ttl`;
- reads the end of large files only (`read_range`), so a multi-GB log is never loaded whole.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin.dashboard.paths import UnsafePathError, clean_relpath, join
from marin.errors import CorruptFileError
from marin.jsonio import parse_json
from marin.status.damaged import damaged_message, parse_jsonl
from marin.status.live_log import read_live_log
from marin.storage.base import Storage
from marin.storage.fs import storage_on
from marin.storage.listing import WHOLE_PARENT_MIN as WHOLE_PARENT_MIN  # re-exported (older imports)
from marin.storage.listing import whole_parents

MAX_JSON_BYTES = 16 << 20
# the engine's own records, which are JSON objects (docs/formats.md); other JSON files may be anything
_STATE_FILE = re.compile(
    r"(/\.marin/(status|step|lease|interruptions|progress)\.json|/experiments/[^/]+\.json)$")
# `read_json_many` lists a parent directory whole (recursively, once per `ttl`) when at least WHOLE_PARENT_MIN
# of the files asked for lie under it and they come from at least half of its entries: the plan's rule, one
# implementation (marin/storage/listing.py `whole_parents`); otherwise each file is read.
SPLIT_LISTING = 256
"""On an object store, `listing` of a directory with more entries than this lists groups of them concurrently
(`prefix_groups`, at most `SPLIT_GROUPS`), from the names of its entries: those its last listing showed, with
its names (one delimited listing, cached like any) listed at the same time to catch an entry the groups miss,
or, the first time, its names listed first. The pages of one recursive listing come one after another, a
round trip each."""
SPLIT_GROUPS = 16


def prefix_groups(names: Sequence[str], most: int) -> list[str]:
    """Prefixes that together cover every name of `names` (each name starts with one of them), at most `most`
    of them, splitting the largest group by its next character while the count allows. A name that is itself
    a prefix of others keeps its group whole (the prefix lists them all)."""
    groups: dict[str, list[str]] = {"": sorted(names)}
    while True:
        splittable = [(len(m), p) for p, m in groups.items() if len(m) > 1 and p not in m]
        if not splittable:
            return sorted(groups)
        _, prefix = max(splittable)
        children: dict[str, list[str]] = {}
        for name in groups[prefix]:
            children.setdefault(name[:len(prefix) + 1], []).append(name)
        if len(groups) - 1 + len(children) > most:
            return sorted(groups)
        del groups[prefix]
        groups.update(children)


_REQUEST_START: contextvars.ContextVar[float | None] = contextvars.ContextVar("marin_request_start",
                                                                          default=None)
"""When the request this thread serves began (`PrefixStore.one_request`), or None outside one."""


_SIGNATURE_KEYS = ("mtime", "size", "ino", "generation", "etag", "ETag", "md5Hash", "updated", "LastModified")


class JsonlRows(list[dict[str, Any]]):
    """The rows of a JSONL file, with how many lines were skipped."""

    def __init__(self, rows: list[dict[str, Any]], skipped: int) -> None:
        super().__init__(rows)
        self.skipped = skipped


@dataclass
class _Entry:
    signature: Any
    checked: float
    value: Any


def _window_start(size: int, offset: int | None, max_bytes: int, jump: bool) -> int:
    """Where a read of at most `max_bytes` from `offset` starts (None: the last `max_bytes`); with `jump`, the
    end of the file when more than `max_bytes` follow `offset`."""
    if offset is None or offset < 0 or offset > size or (jump and size - offset > max_bytes):
        return max(0, size - max_bytes)
    return offset


def _clean(rel: str) -> bool:
    """Whether `rel` is already a clean relative path (a manifest may name anything: a parent with `..` in it
    is never listed, its files are read one by one as before)."""
    try:
        return clean_relpath(rel) == rel
    except UnsafePathError:
        return False


def _too_big(full: str, size: int) -> CorruptFileError:
    return CorruptFileError(f"{full} is {size} bytes; status, step and manifest files are small JSON "
                            f"documents (limit {MAX_JSON_BYTES} bytes), so the dashboard does not load it")


def signature(info: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies one version of a file on any fsspec backend (local mtime/inode, GCS generation, S3
    ETag)."""
    return tuple((k, info[k]) for k in _SIGNATURE_KEYS if k in info)


_PROC_FD = os.path.isdir("/proc/self/fd")


def _local_info(full: str) -> dict[str, Any] | None:
    """The fields of fsspec's LocalFileSystem.info that `signature` and the readers use (mtime, size, inode,
    type; a symlink's target, as fsspec's), from one `os.stat`, without fsspec's path normalisation (which
    cost more than the stat itself); None when absent."""
    try:
        st = os.stat(full)
    except (FileNotFoundError, NotADirectoryError):
        return None
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"name": full, "size": st.st_size, "type": kind, "mtime": st.st_mtime, "ino": st.st_ino}


def _local_ls(path: str) -> list[dict[str, Any]]:
    """fsspec's LocalFileSystem.ls(path, detail=True), the same info dicts, from one scandir without fsspec's
    per-entry path normalisation (about 3x faster on the 1,000 manifests of experiments/)."""
    out = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
                link = stat.S_ISLNK(st.st_mode)
                size = st.st_size
                if link:
                    try:
                        size = entry.stat(follow_symlinks=True).st_size
                    except OSError:
                        size = 0
            except FileNotFoundError:
                continue  # removed since the directory was read
            kind = ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                    else "other")
            info = {"name": entry.path, "size": size, "type": kind,
                    "created": getattr(st, "st_birthtime", st.st_ctime), "islink": link, "mode": st.st_mode,
                    "uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime, "ino": st.st_ino,
                    "nlink": st.st_nlink}
            if link:
                info["destination"] = os.readlink(entry.path)
            out.append(info)
    return out


_FETCHED = ("fetched without listing info",)  # see `_read_batch`


class PrefixStore:
    """A read-only, cached view of one prefix."""

    def __init__(
        self, prefix: str, *, ttl: float | None = None, storage_options: dict[str, Any] | None = None
    ):
        options = dict(storage_options or {})
        if "://" in prefix and not prefix.startswith("file://"):
            # this class keeps its own short-lived caches; fsspec's listings cache would keep a directory's
            # listing for the life of the process (a log created since would stay "not found")
            options.setdefault("use_listings_cache", False)
        fs, root = fsspec.core.url_to_fs(prefix, **options)
        self.fs: fsspec.AbstractFileSystem = fs
        self.is_local = isinstance(fs, LocalFileSystem)
        if self.is_local:
            root = os.path.realpath(os.path.abspath(root))
        self.root: str = root.rstrip("/") or "/"
        self.prefix = prefix
        # Object stores answer a stat in tens of milliseconds: trust entries longer there.
        self.ttl = ttl if ttl is not None else (1.0 if self.is_local else 5.0)
        self._cache: dict[str, _Entry] = {}
        self._ls_cache: dict[str, _Entry] = {}
        self._names_cache: dict[str, _Entry] = {}
        self._find_cache: dict[str, _Entry] = {}
        self._listed_tails: dict[str, frozenset[str]] = {}  # see `listing`
        self._lock = threading.Lock()
        self._storage: Storage | None = None
        protocol = getattr(fs, "protocol", ())
        protocols = protocol if isinstance(protocol, tuple | list) else (protocol,)
        self._gcs, self._s3 = "gs" in protocols, "s3" in protocols

    @property
    def storage(self) -> Storage:
        """The engine's Storage over this store's filesystem (its batches: `read_many`)."""
        if self._storage is None:
            self._storage = storage_on(self.fs, self.fs.unstrip_protocol(self.root).split("://", 1)[0])
        return self._storage

    # ----------------------------------------------------------------------------------------- paths
    def full(self, rel: str) -> str:
        return join(self.root, rel)

    def check_inside(self, rel: str) -> str:
        """Return the full path of `rel`, refusing local symlinks that resolve outside the prefix."""
        full = self.full(rel)
        if self.is_local:
            real = os.path.realpath(full)
            if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
                raise UnsafePathError(f"path {rel!r} resolves outside the prefix (a symlink to {real!r}?)")
        return full

    def relative(self, full_path: str) -> str | None:
        """Relative path of an absolute path/URL written by the executor, or None when it is not under the
        prefix."""
        path = full_path
        for scheme in ("gs://", "gcs://", "s3://", "file://", "memory://"):
            if path.startswith(scheme):
                path = path[len(scheme) :]
                break
        if self.is_local:
            path = os.path.abspath(path)
            # The executor may have written the real path or one through a symlinked prefix.
            if not path.startswith(self.root + "/") and os.path.exists(path):
                path = os.path.realpath(path)
        root = self.root.rstrip("/") + "/"
        if path.startswith(root):
            return path[len(root) :].rstrip("/")
        return None

    # ----------------------------------------------------------------------------------------- cached reads
    def _fresh(self, cache: dict[str, _Entry], key: str, now: float) -> _Entry | None:
        entry = cache.get(key)
        if entry is not None and self.fresh_since(entry.checked, now):
            return entry
        return None

    def fresh_since(self, checked: float, now: float | None = None) -> bool:
        """Whether what was checked against the store at `checked` (time.monotonic) may be served without a
        new look: within `ttl`, or checked during the request being served (`one_request`)."""
        if (time.monotonic() if now is None else now) - checked < self.ttl:
            return True
        start = _REQUEST_START.get()
        return start is not None and checked >= start

    @contextlib.contextmanager
    def one_request(self) -> Iterator[None]:
        """Serve one request: within it, what was checked against the store since it began is not looked
        at again (two views of one page, or the concurrent read-ahead of an experiment page and the page
        itself, share each read), whatever the `ttl`; nothing checked before it is trusted longer than the
        `ttl`, so a status changed since the previous request is on this one."""
        token = _REQUEST_START.set(time.monotonic() if _REQUEST_START.get() is None else _REQUEST_START.get())
        try:
            yield
        finally:
            _REQUEST_START.reset(token)

    @property
    def _direct(self) -> bool:
        """Whether local files are stat'ed and opened with `os` directly rather than through fsspec (whose
        path normalisation costs more than the stat): on fsspec's own local filesystem, not on one wrapped
        around it (a test counting storage calls)."""
        return isinstance(self.fs, LocalFileSystem)

    def _info(self, full: str) -> dict[str, Any] | None:
        if self._direct:
            return _local_info(full)
        try:
            info: dict[str, Any] = self.fs.info(full)
        except FileNotFoundError:
            return None
        return info

    def read_json(self, rel: str, *, info: dict[str, Any] | None = None) -> Any:
        """Parsed JSON at `rel`, or None when the file does not exist. Raises CorruptFileError on bad JSON.

        `info`: the file's entry from :meth:`listing`; its signature stands in for the stat, so a file that
        did not change since it was last parsed costs no storage call at all."""
        return self._cached(rel, self._parse_json, info)

    def read_jsonl(self, rel: str, max_bytes: int = 4 << 20) -> list[dict[str, Any]]:
        """Rows of a JSONL file (its last `max_bytes` only, whole lines), [] when absent. Lines that are not
        JSON objects (cut, binary) are skipped; `skipped_lines` says how many."""
        rows = self._cached(rel, lambda full, info: self._parse_jsonl(full, info, max_bytes))
        return rows if rows is not None else []

    def skipped_lines(self, rel: str) -> int:
        """How many lines the last `read_jsonl` of `rel` skipped (status/damaged.py: skipped and counted)."""
        entry = self._cache.get(self.full(rel))
        return getattr(entry.value, "skipped", 0) if entry is not None else 0

    def read_json_noting(self, rel: str, problems: list[str]) -> Any:
        """`read_json`, except that a file that cannot be read is None and its message (the path and the
        fix, status/damaged.py) is added to `problems`: a page shows it as one banner, never a 500."""
        try:
            return self.read_json(rel)
        except CorruptFileError as e:
            problems.append(str(e))
            return None

    def _cached(self, rel: str, parse: Any, listed: dict[str, Any] | None = None) -> Any:
        full = self.full(rel)
        now = time.monotonic()
        fresh = self._fresh(self._cache, full, now)
        if fresh is not None:
            return fresh.value
        info = listed if listed is not None else self._info(full)
        sig = signature(info) if info is not None else None
        entry = self._cache.get(full)
        if entry is not None and entry.signature == sig:
            entry.checked = now
            return entry.value
        # local files are confined when opened (`_open_local`), by the descriptor actually read
        value = None if info is None else parse(full if self._direct else self.check_inside(rel), info)
        self._cache[full] = _Entry(sig, now, value)
        return value

    def _parse_json(self, full: str, info: dict[str, Any]) -> Any:
        size = info.get("size") or 0
        if size > MAX_JSON_BYTES:
            raise _too_big(full, size)
        if self._direct:
            with self._open_local(full) as f:
                raw = f.read()
        else:
            with self.fs.open(full, "rb") as f:
                raw = f.read()
        return self._parse_record(full, raw)

    def _parse_record(self, full: str, raw: bytes) -> Any:
        """A JSON file's bytes as the views see them: every read path (`read_json`, `read_json_many`) goes
        through here, so a subclass that changes what is seen (the public store's redaction) sees them all."""
        return self._parse_bytes(full, raw)

    def _open_local(self, full: str) -> BinaryIO:
        """`full` opened for reading, refused (UnsafePathError) when the file opened lies outside the prefix
        (a symlink out of it). The check reads where the open descriptor points (`/proc/self/fd/N`, one
        `readlink`) instead of resolving every component of the path (`realpath`: an `lstat` each); the
        file checked is the file read, whatever is renamed meanwhile."""
        if not _PROC_FD:
            self._check_real(full, os.path.realpath(full))
            return open(full, "rb")
        f = open(full, "rb")  # noqa: SIM115 (returned open; closed here on refusal)
        try:
            self._check_real(full, os.readlink(f"/proc/self/fd/{f.fileno()}"))
        except BaseException:
            f.close()
            raise
        return f

    def _check_real(self, full: str, real: str) -> None:
        if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
            rel = full[len(self.root):].lstrip("/") if full.startswith(self.root) else full
            raise UnsafePathError(f"path {rel!r} resolves outside the prefix (a symlink to {real!r}?)")

    def _parse_bytes(self, full: str, raw: bytes) -> Any:
        try:
            data = parse_json(raw, full)
        except CorruptFileError as e:
            cause = e.__cause__
            raise CorruptFileError(damaged_message(full, f"{type(cause).__name__}: {cause}")) from e
        if _STATE_FILE.search(full) and not isinstance(data, dict):
            raise CorruptFileError(damaged_message(full, f"a JSON {type(data).__name__}, not an object"))
        return data

    def _parse_jsonl(self, full: str, info: dict[str, Any], max_bytes: int) -> JsonlRows:
        data, start, _size = self.read_range(full, None, max_bytes, absolute=True)
        if start > 0:
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""  # the first line was cut by the window
        rows, skipped = parse_jsonl(data)
        return JsonlRows(rows, skipped)

    def ls(self, rel: str) -> list[dict[str, Any]]:
        """Entries of a directory: dicts with "name" (basename), "type", "size", "info"; [] when absent."""
        full = self.full(rel)
        now = time.monotonic()
        fresh = self._fresh(self._ls_cache, full, now)
        if fresh is not None:
            cached: list[dict[str, Any]] = fresh.value
            return cached
        try:
            infos = _local_ls(full) if self.is_local else self.fs.ls(full, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            infos = []
        entries = []
        for info in infos:
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if not name or info["name"].rstrip("/") == full.rstrip("/"):
                continue
            entries.append(
                {"name": name, "type": info.get("type", "file"), "size": info.get("size"), "info": info}
            )
        entries.sort(key=lambda e: e["name"])
        self._ls_cache[full] = _Entry(None, now, entries)
        return entries

    def names(self, rel: str) -> list[str]:
        """Names of a directory's entries, sorted, without a stat per entry (`ls` stats every one: a step's
        parent directory can hold hundreds of versions); cached like `ls`; [] when absent."""
        full = self.full(rel)
        now = time.monotonic()
        fresh = self._fresh(self._names_cache, full, now)
        if fresh is not None:
            cached: list[str] = fresh.value
            return cached
        try:
            if self.is_local:
                with os.scandir(full) as it:
                    names = sorted(e.name for e in it)
            else:
                names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(full, detail=False)
                               if p.rstrip("/") != full.rstrip("/"))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        self._names_cache[full] = _Entry(None, now, names)
        return names

    def listing(self, rel: str, tails: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
        """Every file under the directory `rel`, recursively: relative path -> its info (signature keys
        included), from one listing per `ttl` (one paginated call on an object store, a walk locally); {}
        when absent. Views over many small files (verdicts under experiments/) compare these signatures
        with their cache instead of asking for each file.

        `tails`: only the files `{rel}/{entry}/{tail}` for a tail in `tails` are wanted (an experiment page:
        each step's `.marin/status.json`), and the listing may hold only those (plus the tails asked for under
        `rel` before, so that the views of one page share one listing): on GCS a `matchGlob` asks the store
        for just them (marin/storage/gcs.py `gcs_find`), elsewhere they are picked from the whole listing."""
        full = self.full(rel).rstrip("/")
        now = time.monotonic()
        if tails is not None:
            tails = self._listed_tails.setdefault(full, frozenset()) | frozenset(tails)
            self._listed_tails[full] = tails
        fresh = self._fresh(self._find_cache, full, now)
        # an entry holds the tails it was filtered by (None: every file)
        if fresh is not None and (fresh.signature is None or (tails is not None and tails <= fresh.signature)
                                  ):
            cached: dict[str, dict[str, Any]] = fresh.value
            return cached
        # split by names only when it is worth it: a parent whose last listing showed few entries is listed
        # in one go (one that grew since is split at the listing after this one)
        before = None if self.is_local else self._listed_names(rel)
        named = self._names_cache.get(self.full(rel))
        if before is not None and named is not None:  # a listing of some tails only misses entries without
            before = sorted(set(before) | set(named.value))  # them: its groups cover the names listed too
        if self.is_local or (before is not None and len(before) <= SPLIT_LISTING):
            found = self._find_groups(full, [""], tails)
        else:
            found = self._find_split(rel, full, before, tails)
            # the listing is as fresh as the names it was checked against: trusted `ttl` from their listing
            listed = self._names_cache.get(self.full(rel))
            now = min(now, listed.checked) if listed is not None else now
        base = full + "/"
        head = rel.rstrip("/") + "/" if rel.rstrip("/") else ""
        entries = {f"{head}{name[len(base):]}": info for name, info in found.items()
                   if name.startswith(base) and info.get("type", "file") == "file"}
        self._find_cache[full] = _Entry(tails, now, entries)
        return entries

    def _find_split(self, rel: str, full: str, before: list[str] | None,
                    tails: frozenset[str] | None) -> dict[str, dict[str, Any]]:
        """`fs.find(full, detail=True)` of a large directory as a few concurrent listings of the entries
        sharing a name prefix (`prefix_groups`), each paginated on its own, instead of one listing whose pages
        come one after another (a 1,000-step parent: 11 pages of 1,000 objects).

        The groups come from the entries the last listing showed (`before`), and the directory's names (a
        delimited listing) are listed at the same time, not first: an entry that none of those groups covers
        (created since, its name unlike the others') is listed after them, so nothing is missed. Without a
        last listing the names come first; a directory that turns out small is listed in one go."""
        if before is None:
            names = self.names(rel)
            if len(names) <= SPLIT_LISTING:
                return self._find_groups(full, [""], tails)
            return self._find_groups(full, prefix_groups(names, SPLIT_GROUPS), tails)
        groups = prefix_groups(before, SPLIT_GROUPS)
        names_now: list[list[str]] = []
        found = self._find_groups(full, groups, tails, also=lambda: names_now.append(self.names(rel)))
        covered = tuple(groups)
        new = [name for name in names_now[0] if not name.startswith(covered)]
        if new:
            found.update(self._find_groups(full, prefix_groups(new, SPLIT_GROUPS), tails))
        return found

    def _find_groups(self, full: str, groups: list[str], tails: frozenset[str] | None,
                     also: Callable[[], None] | None = None) -> dict[str, dict[str, Any]]:
        """`_find` of each group, concurrently (and `also`, at the same time), merged; a single group "" is
        the whole directory."""
        if len(groups) == 1 and also is None:
            return self._find(full, groups[0], tails)
        out: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=len(groups) + (also is not None)) as pool:
            extra = pool.submit(also) if also is not None else None
            for found in pool.map(lambda group: self._find(full, group, tails), groups):
                out.update(found)
            if extra is not None:
                extra.result()
        return out

    def _find(self, full: str, prefix: str, tails: frozenset[str] | None) -> dict[str, dict[str, Any]]:
        """The files under `full` whose name there starts with `prefix` (fs.find's answer), only those
        `{full}/{entry}/{tail}` for a tail in `tails` unless it is None; {} when absent. On GCS straight
        off objects.list (`gcs_find`: the glob asked of the store, and only the files kept described)."""
        try:
            if self._gcs:
                from fsspec.asyn import sync

                from marin.storage.gcs import gcs_find

                found: dict[str, dict[str, Any]] = sync(self.fs.loop, gcs_find, self.fs, full, prefix, tails)
                return found
            if self._s3:  # listings parsed with the fast timestamp parser (marin/storage/s3.py)
                from marin.storage.s3 import tuned_client

                tuned_client(self.fs)
            found = (self.fs.find(full, prefix=prefix, detail=True) if prefix
                     else self.fs.find(full, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        if tails is None:
            return found
        base = full.rstrip("/") + "/"
        return {name: info for name, info in found.items()
                if (parts := name[len(base):].partition("/"))[0] and parts[1] and parts[2] in tails}

    def read_json_many(self, rels: Sequence[str], parents: Sequence[str]) -> dict[str, Any]:
        """`read_json` of many small files in a few storage calls: rel -> its value, or the CorruptFileError
        `read_json` would raise. `parents[i]`: a directory above `rels[i]` that may be listed whole.

        As fresh as `read_json` (nothing is trusted longer than `ttl`): an entry read within `ttl` comes
        from memory; on an object store the others are checked against one recursive listing of their parent
        when it holds mostly them (`WHOLE_PARENT_MIN`: an unchanged file costs no call, an absent one is
        None), and the rest are read in one concurrent batch (`Storage.read_many`, a GET each, no HEAD)."""
        if self._direct:
            return self._read_local_many(rels)
        out: dict[str, Any] = {}
        if self.is_local:  # a stat costs microseconds here; read_json also refuses symlinks out of the prefix
            for rel in rels:
                try:
                    out[rel] = self.read_json(rel)
                except CorruptFileError as e:
                    out[rel] = e
            return out
        now = time.monotonic()
        stale = []
        for rel, parent in zip(rels, parents, strict=True):
            fresh = self._fresh(self._cache, self.full(rel), now)
            if fresh is not None:
                out[rel] = fresh.value
            else:
                stale.append((rel, parent))
        listed = self._whole_listings(stale)
        unread: list[tuple[str, dict[str, Any] | None]] = []
        for rel, parent in stale:
            if parent not in listed:
                unread.append((rel, None))
                continue
            info = listed[parent].get(rel)
            entry = self._cache.get(self.full(rel))
            if info is None or (entry is not None and entry.signature == signature(info)):
                value = None if info is None else entry.value  # type: ignore[union-attr]
                self._cache[self.full(rel)] = _Entry(None if info is None else signature(info), now, value)
                out[rel] = value
            else:
                unread.append((rel, info))
        out.update(self._read_batch(unread, now))
        return out

    def _read_local_many(self, rels: Sequence[str]) -> dict[str, Any]:
        """`read_json_many` on local disk: `read_json` of each, with what it costs per file cut to one
        `os.stat` (most files asked for are absent: a step writes one of its three result records), its
        signature built from that stat (the same tuple `signature` gives of `_local_info`). Files that
        exist are opened and parsed as `read_json` does (`_open_local` refuses symlinks out of the prefix)."""
        out: dict[str, Any] = {}
        now = time.monotonic()
        cache, ttl, root = self._cache, self.ttl, self.root.rstrip("/") + "/"
        for rel in rels:
            full = root + rel if rel else self.root
            entry = cache.get(full)
            if entry is not None and now - entry.checked < ttl:
                out[rel] = entry.value
                continue
            try:
                st = os.stat(full)
            except (FileNotFoundError, NotADirectoryError):
                cache[full] = _Entry(None, now, None)
                out[rel] = None
                continue
            kind = ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                    else "other")
            info = {"name": full, "size": st.st_size, "type": kind, "mtime": st.st_mtime, "ino": st.st_ino}
            try:
                out[rel] = self._cached(rel, self._parse_json, info)
            except CorruptFileError as e:
                out[rel] = e
        return out

    def _whole_listings(self, files: list[tuple[str, str]]) -> dict[str, dict[str, dict[str, Any]]]:
        """The recursive listing of each parent that holds at least `WHOLE_PARENT_MIN` of `files` (rel,
        parent), from at least half of its entries."""
        by_parent: dict[str, set[str]] = {}
        tails: dict[str, set[str]] = {}  # what lies below each file's entry: the listing keeps only those
        for rel, parent in files:
            first, _, tail = (rel[len(parent):].lstrip("/") if parent else rel).partition("/")
            by_parent.setdefault(parent, set()).add(first)
            tails.setdefault(parent, set()).add(tail)
        whole = whole_parents(by_parent, self._entry_count, allowed=_clean)
        return {p: self.listing(p, None if "" in tails[p] else tails[p]) for p in whole}

    def _entry_count(self, rel: str) -> int:
        """How many entries the directory `rel` has, for deciding how to read under it (never what is read):
        from its last recursive listing when there is one, even one past `ttl` (the listing made next is fresh
        either way; a parent that grew is counted anew at that listing), else from its names (a delimited
        listing: on an object store one more round trip before the listing itself)."""
        listed = self._listed_count(rel)
        return len(self.names(rel)) if listed is None else listed

    def _listed_count(self, rel: str) -> int | None:
        """The number of entries of `rel` its last recursive listing showed (even one past `ttl`), or None."""
        names = self._listed_names(rel)
        return None if names is None else len(names)

    def _listed_names(self, rel: str) -> list[str] | None:
        """The entries of `rel` its last recursive listing showed (even one past `ttl`), sorted, or None."""
        last = self._find_cache.get(self.full(rel).rstrip("/"))
        if last is None:
            return None
        head = len(rel.rstrip("/")) + 1 if rel.rstrip("/") else 0
        return sorted({name[head:].split("/", 1)[0] for name in last.value})

    def read_json_fetched(self, rel: str) -> Any:
        """`read_json` of a file that is often absent (an experiment's verdicts.json), as fresh: on an object
        store one GET of the body whether it is there or not, where `read_json`'s stat of an absent object
        costs a metadata GET and then a directory listing, one after the other. Raises CorruptFileError."""
        if self.is_local:
            return self.read_json(rel)
        now = time.monotonic()
        fresh = self._fresh(self._cache, self.full(rel), now)
        if fresh is not None:
            return fresh.value
        value = self._read_batch([(rel, None)], now, one=True)[rel]
        if isinstance(value, CorruptFileError):
            raise value
        return value

    def _read_batch(self, files: list[tuple[str, dict[str, Any] | None]], now: float,
                    one: bool = False) -> dict[str, Any]:
        """Read and parse `files` (rel, its listed info or None) in one `Storage.read_many` (`one`: a single
        file, one `read_bytes`), caching each."""
        out: dict[str, Any] = {}
        wanted = []
        for rel, info in files:
            size = (info or {}).get("size") or 0
            if size > MAX_JSON_BYTES:
                out[rel] = _too_big(self.full(rel), size)
            else:
                wanted.append((rel, info))
        if not wanted:
            return out
        urls = [self.fs.unstrip_protocol(self.check_inside(r)) for r, _ in wanted]
        found = [self.storage.read_bytes(urls[0])] if one and len(urls) == 1 else self.storage.read_many(urls)
        for (rel, info), raw in zip(wanted, found, strict=True):
            full = self.full(rel)
            try:
                if raw is not None and len(raw) > MAX_JSON_BYTES:
                    raise _too_big(full, len(raw))
                value = None if raw is None else self._parse_record(full, raw)
            except CorruptFileError as e:
                out[rel] = e
                continue
            entry = self._cache.get(full)
            if entry is not None and entry.value == value:
                value = entry.value  # the same object as before: views cached on it stay valid (results.py)
            # a body read without its listing info gets a signature no stat matches: an absent file's (None)
            # must not revive it once it is deleted, nor a present file's skip the re-read
            sig = None if raw is None else signature(info) if info is not None else _FETCHED
            self._cache[full] = _Entry(sig, now, value)
            out[rel] = value
        return out

    def cat_many(self, rels: list[str]) -> dict[str, bytes | Exception]:
        """Read many small files; on object stores 16 at a time (one HTTP round trip each).

        `cat_file` per path rather than `cat(list)`: the list form expands glob characters, and a file name
        is data here, not a pattern.
        """

        def one(rel: str) -> bytes | Exception:
            try:
                data: bytes = self.fs.cat_file(self.check_inside(rel))
                return data
            except (OSError, UnsafePathError) as e:
                return e

        if self.is_local or len(rels) < 2:
            return {r: one(r) for r in rels}
        with ThreadPoolExecutor(max_workers=16) as pool:
            return dict(zip(rels, pool.map(one, rels), strict=True))

    # ----------------------------------------------------------------------------------------- uncached reads
    def info(self, rel: str) -> dict[str, Any] | None:
        return self._info(self.full(rel))

    def read_range(
        self, rel: str, offset: int | None, max_bytes: int, *, absolute: bool = False, jump: bool = True
    ) -> tuple[bytes, int, int]:
        """Read at most `max_bytes` from `offset` (None: the last `max_bytes`). Returns (data, start, file
        size).

        With `jump`, when more than `max_bytes` follow `offset` the window moves to the end of the file: a
        client following a log never falls behind by more than one window.
        """
        full = rel if absolute else self.full(rel) if self._direct else self.check_inside(rel)
        with (self._open_local(full) if self._direct else self.fs.open(full, "rb")) as f:
            known = None if self._direct else getattr(f, "size", None)
            size = (os.fstat(f.fileno()).st_size if self._direct else known if known is not None
                    else self.fs.size(full))
            start = _window_start(size, offset, max_bytes, jump)
            f.seek(start)
            data = f.read(min(max_bytes, size - start))
        return data, start, size

    def read_log_range(self, rel: str, offset: int | None, max_bytes: int) -> tuple[bytes, int, int] | None:
        """`read_range` of an attempt log, live logs on object stores included (marin/status/live_log.py):
        None when there is no such log yet."""
        full = self.check_inside(rel)
        url = None if self.is_local else self.fs.unstrip_protocol(full)
        live = read_live_log(storage_on(self.fs, url.split("://", 1)[0]), url) if url else None
        if live is not None:
            data = live.encode("utf-8")
            start = _window_start(len(data), offset, max_bytes, True)
            return data[start:start + max_bytes], start, len(data)
        if self.info(rel) is None:
            return None
        return self.read_range(rel, offset, max_bytes)

    def stream(self, rel: str, chunk: int = 1 << 16, limit: int | None = None) -> Iterator[bytes]:
        """Yield a file's bytes in chunks (at most `limit` bytes) without loading it whole."""
        full = self.check_inside(rel)
        remaining = limit
        with self.fs.open(full, "rb") as f:
            while remaining is None or remaining > 0:
                data = f.read(chunk if remaining is None else min(chunk, remaining))
                if not data:
                    return
                if remaining is not None:
                    remaining -= len(data)
                yield data

    def lock(self) -> threading.Lock:
        return self._lock
