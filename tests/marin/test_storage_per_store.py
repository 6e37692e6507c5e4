"""One Storage class per store behind one interface: which one a prefix gets, and how a refused precondition
is recognised (by the error S3 returned, never by the digits in a message)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from marin.storage import FsspecStorage, GcsStorage, LocalStorage, S3Storage, Storage, storage_for
from marin.storage.s3 import is_precondition_failure


@pytest.mark.parametrize(
    ("prefix", "cls"),
    [
        ("/tmp/p", LocalStorage),
        ("file:///tmp/p", LocalStorage),
        ("s3://b/p", S3Storage),
        ("gs://b/p", GcsStorage),
        ("memory://p", FsspecStorage),
    ],
    ids=["path", "file-url", "s3", "gs", "other-fsspec"],
)
def test_storage_for_picks_one_class_per_store(prefix: str, cls: type[Storage]) -> None:
    storage = storage_for(prefix)
    assert type(storage) is cls and isinstance(storage, Storage)
    if isinstance(storage, FsspecStorage):
        assert storage.protocol == prefix.split("://")[0] and storage.guarantees


def _client_error(code: str, status: int) -> ClientError:
    response = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "PutObject")  # type: ignore[arg-type]


def test_a_refused_precondition_is_recognised_by_the_error_s3_returned() -> None:
    chained = OSError(errno.EINVAL, "At least one of the pre-conditions you specified did not hold")
    chained.__cause__ = _client_error("PreconditionFailed", 412)
    assert is_precondition_failure(chained)
    assert is_precondition_failure(_client_error("PreconditionFailed", 412))
    other = OSError(errno.EIO, "HTTP 412 in a message, but a different error")
    other.__cause__ = _client_error("SlowDown", 503)
    assert not is_precondition_failure(other)
    assert not is_precondition_failure(OSError("PreconditionFailed 412"))  # text alone proves nothing


def test_the_generic_fsspec_store_is_best_effort_but_correct_without_races(tmp_path: Path) -> None:
    storage = storage_for("memory://marin-generic")
    path = "memory://marin-generic/lease.json"
    assert storage.create_exclusive(path, "a") and not storage.create_exclusive(path, "b")
    found = storage.read_versioned(path)
    assert found is not None and found.text == "a"
    assert storage.replace_if(path, "c", found.token) and not storage.replace_if(path, "d", found.token)
    current = storage.read_versioned(path)
    assert current is not None and not storage.delete_if(path, "stale")
    assert storage.delete_if(path, current.token)
    assert storage.read_text(path) is None
