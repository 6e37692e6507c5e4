"""Fixtures for the dashboard tests: prefixes to serve and clients on them.

`synthetic_prefix` is written by tests.fakes.synthetic_prefix (the documented format, every state);
`hostile_prefix` holds names, descriptions, logs, configs and issue text crafted to inject markup, plus
symlinks pointing out of the prefix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from marin.dashboard import create_app
from tests.fakes.synthetic_prefix import write_prefix

XSS = "<script>alert('xss')</script>"
IMG = "<img src=x onerror=alert(1)>"
HOSTILE_ID = f"evil{IMG}\"'-0a1b2c3d"
HOSTILE_STEP = f"hostile/{IMG}\"quote'"


@pytest.fixture(scope="session")
def synthetic_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("synthetic")
    write_prefix(str(prefix), experiments=12, metrics_rows=60, groups=4)
    return prefix


@pytest.fixture(scope="session")
def synthetic_client(synthetic_prefix: Path) -> Iterator[TestClient]:
    with TestClient(create_app(str(synthetic_prefix), cache_ttl=0)) as client:
        yield client


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")


def write_hostile_prefix(prefix: Path) -> dict[str, str]:
    """One experiment whose every user-provided string tries to inject markup, and symlinks out of the
    prefix."""
    h = "ab" * 32
    rel = f"{HOSTILE_STEP}-{h[:8]}"
    out = prefix / rel
    step = {
        "name": HOSTILE_STEP,
        "hash": h,
        "output_path": str(out),
        "fn": f"evil:{XSS}",
        "fn_source_hash": "0" * 64,
        "version": None,
        "description": f"desc {XSS}",
        "config": {"payload": f"</pre>{XSS}", "q": "\"'><b>x</b>"},
        "identity": {
            "name": HOSTILE_STEP,
            "version": None,
            "config": {"payload": f"</pre>{XSS}"},
            "dependencies": [],
        },
        "config_class": "evil:Cfg",
        "dependencies": [],
        "resources": {},
        "issue": '"><script>alert(2)</script>#1',
        "experiment": HOSTILE_ID,
        "git_commit": XSS,
        "git_dirty": False,
        "packages": {},
        "host": IMG,
        "user": XSS,
        "created": 1764000000.0,
    }
    status = {
        "name": HOSTILE_STEP,
        "hash": h,
        "status": "FAILED",
        "attempt": 1,
        "run_id": "r",
        "executor": IMG,
        "created": 1764000000.0,
        "updated": 1764000002.0,
        "started": 1764000001.0,
        "ended": 1764000002.0,
        "error": {"type": "ValueError", "message": f"bad {XSS}", "traceback": f"Traceback\n{XSS}"},
        "log": "logs/attempt-1.log",
    }
    _write(out / ".marin/step.json", json.dumps(step))
    _write(out / ".marin/status.json", json.dumps(status))
    _write(
        out / ".marin/events.jsonl",
        json.dumps({"ts": 1764000001.0, "event": "FAILED", "attempt": 1, "message": XSS}) + "\n",
    )
    _write(out / ".marin/logs/attempt-1.log", f"log line {XSS}\n{IMG}\n")
    _write(out / f"{IMG}.txt", f"file {XSS}")
    manifest = {
        "id": HOSTILE_ID,
        "script": f"experiments/{IMG}.py",
        "description": f"description {XSS}",
        "issue": '"><script>alert(3)</script>#1',
        "git_commit": XSS,
        "user": IMG,
        "host": XSS,
        "created": 1764000000.0,
        "updated": 1764000002.0,
        "steps": [{"name": HOSTILE_STEP, "hash": h, "output_path": str(out), "dependencies": []}],
        "runs": [
            {
                "run_id": XSS,
                "started": 1764000000.0,
                "ended": 1764000002.0,
                "status": "FAILED",
                "user": IMG,
                "args": [XSS],
                "publisher_errors": [XSS],
            }
        ],
    }
    _write(prefix / "experiments" / f"{HOSTILE_ID}.json", json.dumps(manifest))
    outside = prefix.parent / f"{prefix.name}-outside"
    _write(outside / "secret.txt", "TOP-SECRET")
    os.symlink(outside / "secret.txt", prefix / "secret-link.txt")
    os.symlink(outside, prefix / "outside-dir")
    os.symlink(out / f"{IMG}.txt", prefix / "inside-link.txt")
    return {"step": rel, "experiment": HOSTILE_ID}


@pytest.fixture(scope="session")
def hostile_prefix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    prefix = tmp_path_factory.mktemp("hostile") / "prefix"
    prefix.mkdir()
    return prefix, write_hostile_prefix(prefix)


@pytest.fixture(scope="session")
def hostile_client(hostile_prefix: tuple[Path, dict[str, str]]) -> Iterator[TestClient]:
    with TestClient(create_app(str(hostile_prefix[0]), cache_ttl=0)) as client:
        yield client
