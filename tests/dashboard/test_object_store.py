"""The dashboard on an s3:// prefix, against moto's S3 server on loopback (a real HTTP object store).

Object stores have no directories, no mtimes that fsspec reports the same way and no symlinks: the signature
cache keys on ETag/LastModified there, and step paths fall back to `{name}-{hash8}` when a manifest names
output paths of another location. Run inside the private network namespace (scripts/netns).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from marin.dashboard.synthetic import write_prefix

MOTO = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
pytestmark = pytest.mark.skipif(
    not os.path.exists(MOTO), reason="moto_server is not installed (pip install 'moto[server]')"
)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [MOTO, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_s3_prefix(s3_endpoint: str, tmp_path: Path) -> None:
    import s3fs

    write_prefix(str(tmp_path), experiments=1, metrics_rows=30)  # few files: PUTs cost ~10 ms each

    opts = {"endpoint_url": s3_endpoint, "key": "test", "secret": "test"}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("dash-bucket")
    fs.put(str(tmp_path) + "/", "dash-bucket/prefix/", recursive=True)
    app = create_app("s3://dash-bucket/prefix", cache_ttl=0, storage_options=opts)
    with TestClient(app) as c:
        listing = c.get("/api/experiments", params={"limit": 500}).json()
        assert listing["total"] == 1 and not listing["problems"]
        failed = next(e for e in listing["items"] if e["state"] == "FAILED")
        d = c.get(f"/api/experiments/{failed['id']}").json()
        assert d["step_counts"] == {"SUCCESS": 17, "FAILED": 1, "DEP_FAILED": 2}
        bad = next(s for s in d["steps"] if s["status"] == "FAILED")
        step = c.get(f"/api/steps/{bad['path']}").json()
        assert step["status"]["error"]["type"] == "FloatingPointError" and step["attempts"][0]["log_size"] > 0
        assert "line 39" in c.get(f"/api/logs/{bad['path']}", params={"max_bytes": 100}).json()["text"]
        train = next(s for s in d["steps"] if s["name"].endswith("train/model1"))
        assert c.get(f"/api/metrics/{train['path']}").json()["rows"] == 30
        names = {e["name"] for e in c.get(f"/api/files/{train['path']}").json()["entries"]}
        assert {".marin", "metrics.jsonl", "wandb.json"} <= names
        assert c.get(f"/raw/{train['path']}/wandb.json").json()["mode"] == "offline"
        # a status change on the object store is seen (ETag/LastModified signature)
        key = f"dash-bucket/prefix/{bad['path']}/.marin/status.json"
        status = json.loads(fs.cat_file(key))
        status["status"] = "SUCCESS"
        fs.pipe_file(key, json.dumps(status).encode())
        fs.invalidate_cache()
        again = c.get(f"/api/experiments/{failed['id']}").json()
        assert again["step_counts"]["SUCCESS"] == 18
        assert c.get("/api/files/%2e%2e/other-bucket").status_code == 400
