"""Choosing the Storage for a prefix (`storage_for`) and normalising local prefixes.

One class per store, behind the interface in `base.py`: `LocalStorage` (plain paths and `file://`),
`S3Storage` (`s3://`), `GcsStorage` (`gs://`, `gcs://`), and `FsspecStorage` for any other fsspec filesystem
(best-effort conditional writes). `marin.storage` exports them all; the classes can also be imported from
here, where older code imports them.
"""

from __future__ import annotations

import os

import fsspec

from marin.errors import StorageError
from marin.storage.base import Storage as Storage  # explicit re-export: older code imports it from here
from marin.storage.gcs import GcsStorage
from marin.storage.generic import FsspecStorage
from marin.storage.local import LocalStorage
from marin.storage.s3 import S3Storage

_BY_PROTOCOL: dict[str, type[FsspecStorage]] = {"s3": S3Storage, "gs": GcsStorage, "gcs": GcsStorage}
_STORAGES: dict[str, Storage] = {}


def normalize_prefix(prefix: str) -> str:
    """Make a local prefix absolute (once, so status and data never end up in different places)."""
    if "://" in prefix and not prefix.startswith("file://"):
        return prefix.rstrip("/")
    path = prefix[len("file://") :] if prefix.startswith("file://") else prefix
    return os.path.abspath(os.path.expanduser(path))


def storage_for(prefix: str) -> Storage:
    """The Storage for a prefix (the local one is shared; fsspec caches filesystem instances itself)."""
    if "://" not in prefix or prefix.startswith("file://"):
        return _STORAGES.setdefault("file", LocalStorage())
    protocol = prefix.split("://", 1)[0]
    try:
        # No listings cache: s3fs and gcsfs otherwise keep every listing for the life of the process and then
        # answer `info`/`cat` of a file created since with "not found" (the engine re-reads on purpose).
        fs, _ = fsspec.core.url_to_fs(prefix, use_listings_cache=False)
    except TypeError:  # a filesystem that takes no such option
        fs, _ = fsspec.core.url_to_fs(prefix)
    except (ImportError, ValueError) as e:
        raise StorageError(
            f"cannot open storage for prefix {prefix!r}: {e}. Install the fsspec backend for {protocol}:// "
            "(gcsfs for gs://, s3fs for s3://)"
        ) from e
    return storage_on(fs, protocol)


def storage_on(fs: fsspec.AbstractFileSystem, protocol: str) -> Storage:
    """The Storage of `protocol` over a filesystem opened elsewhere (with its own options: credentials, an
    endpoint), e.g. the dashboard's."""
    return _BY_PROTOCOL.get(protocol, FsspecStorage)(fs, protocol)
