"""Pointing this process's gs:// clients at a GCS emulator on loopback, and putting everything back after."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gcs_emulator(endpoint: str, *, fsspec_endpoint: bool = False) -> Iterator[None]:
    """google-cloud-storage (STORAGE_EMULATOR_HOST) and gcsfs (anonymous; the endpoint too if
    `fsspec_endpoint`) talk to `endpoint` inside the block. fsspec's config is process-global and marin caches
    one GCS client, so both are restored and the cache emptied on the way in and out: later tests never reach
    a stopped emulator."""
    import fsspec

    from marin.storage import gcs as marin_gcs

    saved_env = os.environ.get("STORAGE_EMULATOR_HOST")
    saved_conf = fsspec.config.conf.get("gs")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    fsspec.config.conf["gs"] = {"token": "anon", **({"endpoint_url": endpoint} if fsspec_endpoint else {})}
    marin_gcs._GCS_CLIENTS.clear()
    try:
        yield
    finally:
        marin_gcs._GCS_CLIENTS.clear()
        if saved_env is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved_env
        if saved_conf is None:
            fsspec.config.conf.pop("gs", None)
        else:
            fsspec.config.conf["gs"] = saved_conf
