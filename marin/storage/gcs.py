"""Storage on Google Cloud Storage (gcsfs), with generation preconditions where they can be sent.

Create is `ifGenerationMatch=0` (gcsfs `mode="create"`). The version token is the object's generation, and
compare-and-swap and delete send `if_generation_match=<generation>` through google-cloud-storage, which gcsfs
does not expose; a refused precondition is google-api-core's `PreconditionFailed` (or `NotFound` for an
object deleted meanwhile). Without google-cloud-storage, or on a store that reports no generation (some
emulators), the token is the text and the conditions are best effort, as in `generic.py`.
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections.abc import Callable, Collection
from typing import Any

from marin.errors import StorageError
from marin.storage.base import Versioned
from marin.storage.generic import FsspecStorage, split_bucket
from marin.storage.listing import digest_chunks

# One google-cloud-storage client per process (tests that point it at an emulator empty this:
# tests/marin/gcs_env.py).
_GCS_CLIENTS: dict[str, Any] = {}
# ... and a forked child (a local worker) gets its own: a client inherited across fork shares the parent's
# pooled connections, and two processes reading answers off one socket get each other's (a blob whose
# properties come back empty).
os.register_at_fork(after_in_child=_GCS_CLIENTS.clear)


def gcs_blob(path: str) -> Any:
    """The google-cloud-storage blob of a gs:// path, or None when that library is not installed."""
    try:
        from google.cloud import storage as gcs
    except ImportError:  # gcsfs alone gives create-if-absent only; see the module docstring
        return None
    bucket, key = split_bucket(path)
    client = _GCS_CLIENTS.get("client")
    if client is None:
        anonymous = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
        client = gcs.Client.create_anonymous_client() if anonymous else gcs.Client()
        _GCS_CLIENTS["client"] = client
    return client.bucket(bucket).blob(key)


def gcs_get_versioned(blob: Any) -> tuple[bool, Versioned | None]:
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
            data: bytes = blob.download_as_bytes(if_generation_match=generation)
        except (gexc.PreconditionFailed, gexc.NotFound):  # rewritten or deleted since the metadata was read
            continue
        return True, Versioned(data.decode("utf-8"), generation)
    raise StorageError(f"{blob.name}: rewritten during every one of 5 reads; retry the operation")


def gcs_get_in_one(blob: Any) -> tuple[bool, Versioned | None]:
    """`gcs_get_versioned` in one request where the store allows: the body's download answers with the
    generation it served (`x-goog-generation`, which google-cloud-storage sets on the blob), so text and
    token come from one response. A store that sends no generation there is read the two-request way."""
    from google.api_core import exceptions as gexc

    try:
        data: bytes = blob.download_as_bytes()
    except gexc.NotFound:
        return True, None
    generation = blob.generation
    if not isinstance(generation, int):
        return gcs_get_versioned(blob)
    return True, Versioned(data.decode("utf-8"), generation)


def _conditional(action: Callable[[], object]) -> bool:
    from google.api_core import exceptions as gexc

    try:
        action()
    except (gexc.PreconditionFailed, gexc.NotFound):
        return False
    return True


class GcsStorage(FsspecStorage):
    guarantees = (
        "single-PUT writes; create ifGenerationMatch=0; compare-and-swap/delete on the generation "
        "(needs google-cloud-storage)"
    )

    def create_exclusive(self, path: str, text: str) -> bool:
        return self._create_if_absent(path, text)

    def listed_checksum(self, data: bytes) -> str | None:
        """A non-composite object's `md5Hash` (base64), as listings report it."""
        return digest_chunks("md5", iter((data,)))

    def create_versioned(self, path: str, text: str) -> tuple[bool, Any]:
        """`ifGenerationMatch=0` in one multipart upload; the token is the generation it answers with."""
        blob = gcs_blob(path)
        if blob is None:
            return self.create_exclusive(path, text), None
        from google.api_core import exceptions as gexc

        try:
            blob.upload_from_string(text, if_generation_match=0)
        except gexc.PreconditionFailed:
            return False, None
        generation = blob.generation
        return True, generation if isinstance(generation, int) else None

    def read_versioned(self, path: str) -> Versioned | None:
        blob = gcs_blob(path)
        if blob is not None:
            has_generations, found = gcs_get_in_one(blob)
            if has_generations:
                return found
        # no google-cloud-storage, or no generation (an emulator that does not report it): compare contents
        return super().read_versioned(path)

    def replace_if(self, path: str, text: str, token: Any) -> bool:
        blob = gcs_blob(path) if isinstance(token, int) else None
        if blob is None:
            return super().replace_if(path, text, token)
        return _conditional(lambda: blob.upload_from_string(text, if_generation_match=token))

    def delete_if(self, path: str, token: Any) -> bool:
        blob = gcs_blob(path) if isinstance(token, int) else None
        if blob is None:
            return super().delete_if(path, token)
        return _conditional(lambda: blob.delete(if_generation_match=token))


LIST_FIELDS = ("items(name,size,generation,metageneration,md5Hash,crc32c,etag,updated,timeCreated),prefixes,"
               "nextPageToken")
"""What `gcs_find` asks objects.list for (`fields`): the names, sizes and versions a listing is read for; a
full object resource (ACLs, links, storage class...) is several times longer. A store that ignores `fields`
answers the whole resource, and the same keys are read from it."""

LISTED_KEYS = ("name", "size", "generation", "metageneration", "md5Hash", "crc32c", "etag", "updated",
               "timeCreated")
"""The keys of each object `LIST_FIELDS` asks for: `gcs_find` keeps only these of an answer that holds more
(a store that ignores `fields`), so every store's listing describes its objects alike."""

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]{},])")


def glob_escape(text: str) -> str:
    """`text` as a literal inside a GCS `matchGlob` pattern (a backslash before each special character)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def member_glob(base: str, tails: Collection[str]) -> str:
    """The `matchGlob` of the objects `{base}{entry}/{tail}` (an entry: one path component, a tail one of
    `tails`)."""
    alternatives = sorted(glob_escape(t) for t in tails)
    tail = alternatives[0] if len(alternatives) == 1 else "{" + ",".join(alternatives) + "}"
    return f"{glob_escape(base)}*/{tail}"


async def gcs_find(fs: Any, path: str, prefix: str = "",
                   tails: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """gcsfs's `find(path, prefix=prefix, detail=True)` (the files under the directory `path` whose name
    there starts with `prefix`, each as gcsfs describes it from the keys `LIST_FIELDS` asks for), or with
    `tails` only the files `{path}/{entry}/{tail}` for a tail in `tails`, from objects.list pages read
    straight off the API: gcsfs's find builds an info dict for every object and a directory cache on top,
    most of it for files a caller then drops.

    With `tails` the request carries a `matchGlob` (`member_glob`), so a store that supports it (GCS) sends
    only those objects; every answer is filtered here as well, so a store that ignores the glob (some
    emulators) gives the same result, and one that refuses it (a 400) is asked again without it. Each page is
    filtered as it is parsed (`parse_page`), so only the objects kept outlive it."""
    bucket, key, _ = fs.split_path(path)
    base = key.rstrip("/") + "/" if key else ""
    params: dict[str, Any] = {"prefix": base + prefix, "fields": LIST_FIELDS}
    if tails:
        params["matchGlob"] = member_glob(base, tails)
    wanted = frozenset(tails) if tails is not None else None

    def keep(name: str) -> bool:
        if not name.startswith(params["prefix"]):
            return False
        if wanted is None:
            return True
        entry, slash, tail = name[len(base):].partition("/")
        return bool(entry and slash and tail in wanted)

    try:
        items = await _list_pages(fs, bucket, params, keep)
    except (ValueError, OSError) as e:
        if isinstance(e, FileNotFoundError) or "matchGlob" not in params:
            raise
        del params["matchGlob"], params["fields"]  # a store that refuses them: the plain listing
        items = await _list_pages(fs, bucket, params, keep)
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        info: dict[str, Any] = fs._process_object(bucket, item)
        out[info["name"]] = info
    return out


def parse_page(raw: bytes, keep: Callable[[str], bool]) -> tuple[list[dict[str, Any]], str | None]:
    """One objects.list answer's items whose name `keep` accepts (only their `LISTED_KEYS`), and its
    nextPageToken.

    With the cyclic garbage collector paused while the page is parsed and filtered: a page of 1,000 full
    object resources (a store that ignores `fields` and `matchGlob`: about 1 MB) is some 5,000 dicts and
    lists, so a parse with the collector running makes it collect the young generation about seven times
    and promote the whole tree, still alive, to the old one; a dashboard listing a 1,000-step experiment
    (6 MB a load) then made a full collection of its heap every third load (80-200 ms, docs/benchmarks.md).
    The tree holds no cycles: what is not kept is freed by reference counting before the collector runs
    again, and what is kept (flat dicts of strings) the collector stops tracking at its next pass.
    (`gc.disable` is process-wide; another thread's allocations meanwhile are collected later.)"""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        page = json.loads(raw)
        if not isinstance(page, dict):
            raise ValueError(f"objects.list answered a JSON {type(page).__name__}, not an object")
        items = [{k: item[k] for k in LISTED_KEYS if k in item}
                 for item in page.get("items") or () if keep(item.get("name", ""))]
        token = page.get("nextPageToken")
        del page
    finally:
        if paused:
            gc.enable()
    return items, token if isinstance(token, str) and token else None


async def _list_pages(fs: Any, bucket: str, params: dict[str, Any],
                      keep: Callable[[str], bool]) -> list[dict[str, Any]]:
    """The items `keep` accepts of an objects.list with `params`, page after page (GCS pages at 1,000
    items), each page parsed and filtered on its own (`parse_page`)."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        _, raw = await fs._call("GET", "b/{}/o", bucket, pageToken=token, **params)
        kept, token = parse_page(raw, keep)
        items.extend(kept)
        if not token:
            return items
