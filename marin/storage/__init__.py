"""Storage under the prefix: one class per store behind one interface, atomic and conditional writes,
leases."""

from marin.storage.base import Storage, Versioned
from marin.storage.fs import normalize_prefix, storage_for
from marin.storage.gcs import GcsStorage
from marin.storage.generic import FsspecStorage
from marin.storage.local import LocalStorage
from marin.storage.s3 import S3Storage

__all__ = [
    "FsspecStorage",
    "GcsStorage",
    "LocalStorage",
    "S3Storage",
    "Storage",
    "Versioned",
    "normalize_prefix",
    "storage_for",
]
