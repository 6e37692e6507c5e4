"""Storage under the prefix: fsspec helpers with a fast local path, atomic writes and conditional writes."""

from marin.storage.fs import FsspecStorage, LocalStorage, Storage, Versioned, normalize_prefix, storage_for

__all__ = ["FsspecStorage", "LocalStorage", "Storage", "Versioned", "normalize_prefix", "storage_for"]
