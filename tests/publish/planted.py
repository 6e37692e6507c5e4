"""A synthetic prefix with secrets and private names planted in every field a record can carry.

The base is tests.fakes.synthetic_prefix (written through the engine's own writers); on top of it, experiment
exp100's manifest, one of its steps' step.json, log, events, alerts and the local tracker's issue get the
strings of SECRETS, NAMES and PRIVATE, which no published byte may contain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marin.tracking.local import LocalTracker
from tests.fakes.synthetic_prefix import write_prefix

USER, HOST = "alice-smith-private", "gpu-node-17.corp.internal"
SECRETS = (
    "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2",
    "hf_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3",
    "AKIA" + "ABCDEFGHIJKLMNOP",
    "sk-" + "proj-abcdefghijklmnop1234",
    "s3cr3tP4ssw0rd-zz",
    "privvalue987",
    "wandbkey-0123456789abcdef",
)
NAMES = (USER, HOST)
PRIVATE = ("/srv/privatedir-qq", "private-bucket-zz", "secret-org-qq", "private-repo-qq")
PUBLIC = "exp100_sweep-00000000"
PUBLIC_STEP = "sweep00/train/model0"


def _plant_text() -> str:
    return (f"token {SECRETS[0]} and {SECRETS[1]} key {SECRETS[2]} openai {SECRETS[3]} "
            f"WANDB_API_KEY={SECRETS[6]} data at /srv/privatedir-qq/shard.bin and gs://private-bucket-zz/raw "
            f"by {USER} on {HOST}, see https://github.com/secret-org-qq/private-repo-qq/issues/3 and "
            "secret-org-qq/private-repo-qq#7 "
            f"home /home/{USER}/work")


def _edit_json(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _plant_manifest(prefix: Path) -> None:
    def change(m: dict[str, Any]) -> None:
        m.update(user=USER, host=HOST, description="desc " + _plant_text(),
                 script=f"/home/{USER}/lab/experiments/exp100.py")
        m["notebook"] = {"hypothesis": "hypothesis " + _plant_text(), "criteria": [], "tags": ["public-tag"],
                         "sha256": "0" * 64}
        for r in m.get("runs") or []:
            r["user"], r["host"] = USER, HOST
    _edit_json(prefix / "experiments" / f"{PUBLIC}.json", change)


def _plant_step(step: Path) -> None:
    def change(s: dict[str, Any]) -> None:
        s.update(user=USER, host=HOST, description=_plant_text())
        s["config"].update(api_key=SECRETS[4], env={"MY_PRIVATE_VAR": SECRETS[5]}, note=_plant_text(),
                           data_path="/srv/privatedir-qq/data", bucket="gs://private-bucket-zz/x")
    _edit_json(step / ".marin" / "step.json", change)
    with open(step / ".marin" / "events.jsonl", "a") as f:
        f.write(json.dumps({"ts": 1764000100.0, "event": "PREEMPTED", "attempt": 1,
                            "message": "preempted " + _plant_text()}) + "\n")
    logs = step / ".marin" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "attempt-1.log").write_text("log " + _plant_text() + "\n")
    (step / "alerts.jsonl").write_text(json.dumps({
        "event": "fired", "id": "a1", "rule": "loss_spike", "kind": "rule", "severity": "warning",
        "summary": "alert " + _plant_text(), "values": {"token": SECRETS[4]}, "time": 1764000200.0,
        "host": HOST}) + "\n")


def write_planted_prefix(prefix: Path, experiments: int = 4) -> Path:
    write_prefix(str(prefix), experiments=experiments, metrics_rows=20, groups=experiments)
    _plant_manifest(prefix)
    step = next(p for p in prefix.glob("sweep00/train/model0-*"))
    _plant_step(step)
    tracker = LocalTracker(str(prefix), repo="marin-community/marin")
    tracker.create_issue("issue " + _plant_text(), "body " + _plant_text(), labels=["marin:public"],
                         number=100)
    return step


def forbidden() -> tuple[str, ...]:
    return (*SECRETS, *NAMES, *PRIVATE)
