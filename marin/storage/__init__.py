"""Storage under the prefix: one class per store behind one interface, atomic and conditional writes,
leases."""

from marin.storage.fs import (
    FsspecStorage,
    GcsStorage,
    LocalStorage,
    S3Storage,
    Storage,
    Versioned,
    normalize_prefix,
    storage_for,
)

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
