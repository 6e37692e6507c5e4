"""Runs a small experiment on a Ray cluster given by address (a separate process: one Ray per process).

    python -m tests.marin.ray_runner ADDRESS PREFIX
Prints one JSON line: {"status", "node": <tag written by the pinned step>, "log": <its log text>}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from marin import ExecutorMainConfig, Step, run_experiment, this_output_path
from tests.marin.fns import EnvConfig, WriteConfig, write_env, write_numbers


def main(address: str, prefix: str) -> int:
    pinned = Step(name="cluster/pinned", fn=write_env,
                  resources={"num_cpus": 1, "resources": {"fake_gpu": 1}},
                  config=EnvConfig(output_path=this_output_path()))
    anywhere = Step(name="cluster/anywhere", fn=write_numbers,
                    config=WriteConfig(output_path=this_output_path(), n=4))
    result = run_experiment([pinned, anywhere],
                            ExecutorMainConfig(prefix=prefix, backend="ray", ray_address=address),
                            verbose=False, script="tests/cluster.py")
    out = Path(result.output_path("cluster/pinned"))
    log = Path(result.output_path("cluster/anywhere"), ".marin/logs/attempt-1.log").read_text()
    print(json.dumps({"status": result.status, "node": (out / "node.txt").read_text(), "log": log}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
