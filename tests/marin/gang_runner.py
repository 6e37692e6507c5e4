"""Runs one gang attempt through `marin.execution.gang.submit_gang` on a cluster given by address (its own
process: one Ray per process) and prints its result as one JSON line.

    python -m tests.marin.gang_runner ADDRESS OUTPUT_DIR RESOURCES_JSON CONFIG_JSON
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import ray

from marin.definition.step import Resources
from marin.execution.attempt import AttemptResult
from marin.execution.gang import GangPlan, submit_gang
from tests.marin.gang_fns import GangConfig, gang_member


def main(address: str, output: str, resources_json: str, config_json: str) -> int:
    ray.init(address=address, log_to_driver=False)
    resources = Resources.coerce(json.loads(resources_json))
    config = GangConfig(output_path=output, **json.loads(config_json))
    log_path = str(Path(output, ".marin/logs/attempt-1.log"))
    payload = ray.cloudpickle.dumps((gang_member, config, log_path, {}, None))
    ref = submit_gang(
        ray,
        GangPlan.of(resources),
        payload,
        None,
        name="test/gang:attempt-1",
        log_path=log_path,
        env={},
        after=[],
    )
    result = AttemptResult.from_wire(ray.get(ref))  # Ray attempts return wire tuples (ray_backend.py)
    fields = {k: v for k, v in dataclasses.asdict(result).items() if k != "exception"}
    print(json.dumps({**fields, "ok": result.ok, "outcome": result.outcome.value}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:5]))
