"""`marin status SCRIPT` prints each step's interruption ledger and the experiment's goodput."""

from __future__ import annotations

import json
from pathlib import Path

from marin.status.interruptions import record_interruption, record_resume
from marin.storage.fs import storage_for
from tests.marin.test_cli import run


def test_marin_status_prints_the_ledger_and_the_goodput(tmp_path: Path) -> None:
    prefix = str(tmp_path / "out")
    assert (
        run(
            "-m", "marin", "run", "experiments/hello_world.py", "--prefix", prefix, "--backend", "local"
        ).returncode
        == 0
    )
    [numbers] = Path(prefix, "demo").glob("numbers-*")
    storage = storage_for(str(numbers))
    record_interruption(
        storage,
        str(numbers),
        name="demo/numbers",
        attempt=1,
        run_id="r",
        cause="node_died",
        hosts=["10.0.0.7"],
        started=0.0,
        ended=30.0,
    )
    record_resume(storage, str(numbers), attempt=2, started=40.0)
    status_file = numbers / ".marin/status.json"
    status = json.loads(status_file.read_text())
    status_file.write_text(json.dumps({**status, "attempt": 2, "created": status["ended"] - 100.0}))
    text = run("-m", "marin", "status", "experiments/hello_world.py", "--prefix", prefix)
    assert text.returncode == 0, text.stderr
    assert "attempt 1 node_died hosts=10.0.0.7, attempt 2 from scratch, 40.0 s lost" in text.stdout
    assert "goodput 0." in text.stdout and "40.0 s lost to interruptions" in text.stdout
    doc = json.loads(
        run(
            "-m", "marin", "status", "experiments/hello_world.py", "--prefix", prefix, "--format", "json"
        ).stdout
    )
    by_name = {s["name"]: s for s in doc["steps"]}
    assert [e["cause"] for e in by_name["demo/numbers"]["interruptions"]] == ["node_died"]
    assert by_name["demo/total"]["interruptions"] == [] and doc["goodput"]["time_lost_s"] == 40.0
