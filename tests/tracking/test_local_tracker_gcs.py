"""The local tracker on a gs:// prefix, against the GCS emulator on loopback (gcp-storage-emulator)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marin.tracking.local import LocalTracker

EMULATOR = shutil.which("gcp-storage-emulator") or str(Path(sys.executable).parent / "gcp-storage-emulator")


@pytest.fixture
def gcs_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if not os.path.exists(EMULATOR):
        pytest.skip("gcp-storage-emulator is not installed (pip install gcp-storage-emulator)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([EMULATOR, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory",
                             "--default-bucket=tracker-test"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.time() < deadline and proc.poll() is None, "the GCS emulator did not start"
                time.sleep(0.1)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        yield "gs://tracker-test"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_gs_prefix_writers_on_two_machines_see_each_other(gcs_bucket: str, tmp_path: Path) -> None:
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()  # the emulator's address is new for this test
    prefix = f"{gcs_bucket}/lab"
    alice = LocalTracker(prefix, cache_dir=tmp_path / "alice")  # each cache dir stands for one machine
    bob = LocalTracker(prefix, cache_dir=tmp_path / "bob")
    alice.create_issue("Wider router", "hypothesis")
    bob.create_comment(1, "from bob")
    alice.create_comment(1, "from alice")
    bob.add_labels(1, ["marin:running"])
    dashboard = LocalTracker(prefix, readonly=True, cache_dir=tmp_path / "dashboard")
    assert [c.body for c in dashboard.list_comments(1)] == ["from bob", "from alice"]
    assert dashboard.get_issue(1).labels == ("marin:running",)
    assert gcsfs.GCSFileSystem().exists("tracker-test/lab/.marin-tracker/tracker.sqlite3")
