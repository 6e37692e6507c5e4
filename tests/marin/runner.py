"""A tiny experiment run as a separate process by the race and crash tests.

    python -m tests.marin.runner shared PREFIX WORKDIR [LEASE_TIMEOUT_S]   # diamond of counting steps
    python -m tests.marin.runner killable PREFIX WORKDIR [LEASE_TIMEOUT_S] [BACKEND] [ISSUE]  # a -> b -> c
BACKEND is local (the default) or ray (an embedded Ray started by the run); ISSUE (e.g.
local/experiments#7) links the run to an issue of the local tracker under the prefix.
"""

from __future__ import annotations

import os
import sys

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from tests.marin.fns import BlockConfig, CountConfig, block_until_released, count_and_write


def shared_dag(workdir: str, sleep_s: float = 0.3) -> list[Step]:
    counter = os.path.join(workdir, "counter.txt")
    root = Step(name="race/root", fn=count_and_write,
                config=CountConfig(output_path=this_output_path(), counter_file=counter, sleep_s=sleep_s))
    left = Step(name="race/left", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter, sleep_s=sleep_s,
        inputs=(output_path_of(root),)))
    right = Step(name="race/right", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter, sleep_s=sleep_s,
        inputs=(output_path_of(root),)))
    join = Step(name="race/join", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter,
        inputs=(output_path_of(left), output_path_of(right))))
    return [join]


def killable_dag(workdir: str) -> list[Step]:
    counter = os.path.join(workdir, "counter.txt")
    a = Step(name="crash/a", fn=count_and_write,
             config=CountConfig(output_path=this_output_path(), counter_file=counter))
    b = Step(name="crash/b", fn=block_until_released, config=BlockConfig(
        output_path=this_output_path(), started_file=os.path.join(workdir, "b-started"),
        release_file=os.path.join(workdir, "b-release")), retries=0)
    b_after_a = Step(name="crash/c", fn=count_and_write, config=CountConfig(
        output_path=this_output_path(), counter_file=counter, inputs=(output_path_of(a), output_path_of(b))))
    return [b_after_a]


def main(argv: list[str]) -> int:
    kind, prefix, workdir = argv[:3]
    lease_timeout = float(argv[3]) if len(argv) > 3 else 60.0
    backend = argv[4] if len(argv) > 4 else "local"
    issue = argv[5] if len(argv) > 5 else None
    steps = shared_dag(workdir) if kind == "shared" else killable_dag(workdir)
    result = run_experiment(steps,
                            ExecutorMainConfig(prefix=prefix, backend=backend, lease_timeout_s=lease_timeout,
                                               issue=issue, max_concurrent=4),
                            verbose=False, script=f"tests/{kind}.py")
    return 0 if result.status == "SUCCESS" else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
