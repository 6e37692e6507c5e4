"""Runs an experiment of gang (and accelerator) steps on a cluster given by address, in its own process (one
Ray per process), and prints one JSON line: the run's status and, per step, status.json, the events and the
interruption ledger.

    python -m tests.marin.gang_run_runner ADDRESS PREFIX STEPS_JSON [ISSUE]
STEPS_JSON: a list of {"name", "fn": "gang"|"pid", "resources", "config", "retries", "max_preemptions"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from marin import Resources, Step, run_experiment, this_output_path
from marin.execution.argv import ExecutorMainConfig
from tests.marin.gang_fns import GangConfig, PidConfig, gang_member, write_pid


def _step(spec: dict[str, Any]) -> Step:
    fn, config = (
        (gang_member, GangConfig(output_path=this_output_path(), **spec.get("config", {})))
        if spec["fn"] == "gang"
        else (write_pid, PidConfig(output_path=this_output_path()))
    )
    return Step(
        name=spec["name"],
        fn=fn,
        config=config,
        resources=Resources.coerce(spec.get("resources")),
        retries=spec.get("retries", 0),
        max_preemptions=spec.get("max_preemptions", 100),
    )


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def main(address: str, prefix: str, steps_json: str, issue: str | None = None) -> int:
    """ISSUE (local/experiments#7): the local tracker's issue under the prefix the run posts its comment
    to."""
    steps = [_step(s) for s in json.loads(steps_json)]
    result = run_experiment(
        steps,
        ExecutorMainConfig(prefix=prefix, backend="ray", ray_address=address, issue=issue),
        verbose=False,
        script="tests/gang_run.py",
    )
    report: dict[str, Any] = {"status": result.status, "steps": {}}
    for step in steps:
        meta = Path(result.output_path(step.name), ".marin")
        events = (
            [json.loads(line) for line in (meta / "events.jsonl").read_text().splitlines()]
            if (meta / "events.jsonl").exists()
            else []
        )
        report["steps"][step.name] = {
            "output_path": result.output_path(step.name),
            "status": _read(meta / "status.json"),
            "events": events,
            "ledger": _read(meta / "interruptions.json"),
        }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:5]))
