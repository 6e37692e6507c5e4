"""exp14: the submit tests' experiment: three steps in a chain, the middle one waiting for a gate file."""

import hashlib
import os
from pathlib import Path

from demo_steps import MarkConfig, mark

from marin import Step, executor_main, output_path_of, this_output_path

COUNTER = os.environ["DEMO_COUNTER_DIR"]
GATE = os.environ.get("DEMO_GATE", "")
if os.environ.get("MARIN_SUBMITTED"):  # on the cluster: prove the sealed secret arrived, without writing it
    seen = hashlib.sha256(os.environ.get("DEMO_SECRET", "").encode()).hexdigest()
    Path(COUNTER, "secret-seen.txt").write_text(seen)

first = Step(
    name="demo/first", fn=mark, config=MarkConfig(output_path=this_output_path(), counter_dir=COUNTER)
)
slow = Step(
    name="demo/slow",
    fn=mark,
    config=MarkConfig(
        output_path=this_output_path(), counter_dir=COUNTER, gate=GATE, after=output_path_of(first)
    ),
)
last = Step(
    name="demo/last",
    fn=mark,
    config=MarkConfig(output_path=this_output_path(), counter_dir=COUNTER, after=output_path_of(slow)),
)

if __name__ == "__main__":
    executor_main([last], description="submit demo")
