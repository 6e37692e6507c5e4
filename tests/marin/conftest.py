"""Fixtures shared by the engine's tests: an s3:// bucket on the session's moto server (the gs:// bucket on
fake-gcs-server, `fake_gcs_bucket`, is in the root conftest.py: the dashboard's tests use it too)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _listed_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Plans on object stores keep status files in a local cache (marin/storage/listed_cache.py): the
    tests' go to a temporary directory, not the user's ~/.cache."""
    saved = os.environ.get("MARIN_CACHE_DIR")
    os.environ["MARIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("marin-cache"))
    yield
    if saved is None:
        os.environ.pop("MARIN_CACHE_DIR", None)
    else:
        os.environ["MARIN_CACHE_DIR"] = saved


@pytest.fixture(scope="module")
def s3_bucket(moto_endpoint: str) -> Iterator[str]:
    """A bucket on the session's moto server (shared by the modules that use it: each writes under its own
    paths); fsspec's s3 defaults point at it for the using module only."""
    import fsspec

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION",
                                            "FSSPEC_S3_ENDPOINT_URL", "AWS_EC2_METADATA_DISABLED")}
    saved_conf = fsspec.config.conf.get("s3")
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "FSSPEC_S3_ENDPOINT_URL": moto_endpoint, "AWS_EC2_METADATA_DISABLED": "true"})
    fsspec.config.conf["s3"] = {"endpoint_url": moto_endpoint}
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        if not fs.exists("marin-test"):  # made by the first module of the session that uses it
            fs.mkdir("marin-test")
        yield "s3://marin-test"
    finally:
        # fsspec's config is process-global: leaving this endpoint in it would send later tests' s3:// calls
        # here
        if saved_conf is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = saved_conf
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
