"""Hello world: two steps, the smallest complete experiment (and what CI runs end to end).

Hypothesis: the executor runs `demo/numbers` and then `demo/total`, which adds the numbers 0..9 up to exactly
45, and a second run reuses both results.

Criterion: demo/total:total.json/total higher than 44 by at least 1
Criterion: demo/total:total.json/total lower than 46 by at least 1
Tags: demo

    marin run experiments/hello_world.py --backend local       # or: python experiments/hello_world.py
    marin plan experiments/hello_world.py --format json        # what would run, and why

`demo/total` depends on `demo/numbers` only through `output_path_of(numbers, "numbers.txt")` in its config.
Change `n` and both steps get new output paths; `marin plan` then explains `config.n: 10 -> 20`.
"""

from __future__ import annotations

import dataclasses

import fsspec

from marin import Step, executor_main, output_path_of, this_output_path


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    output_path: str
    """Where numbers.txt goes (the step's own output path)."""
    n: int = 10
    """How many numbers to write: 0 .. n-1."""


def write_numbers(cfg: WriteConfig) -> None:
    # fsspec, so the same step writes to a local prefix, gs:// or s3://
    with fsspec.open(f"{cfg.output_path}/numbers.txt", "w", auto_mkdir=True) as f:
        f.write("\n".join(str(i) for i in range(cfg.n)) + "\n")
    print(f"wrote {cfg.n} numbers to {cfg.output_path}")


@dataclasses.dataclass(frozen=True)
class SumConfig:
    input_path: str
    """The numbers file to add up."""
    output_path: str
    """Where total.txt (and total.json, the number the criterion reads) go."""


def sum_numbers(cfg: SumConfig) -> None:
    with fsspec.open(cfg.input_path, "r") as f:
        total = sum(int(line) for line in f if line.strip())
    with fsspec.open(f"{cfg.output_path}/total.txt", "w", auto_mkdir=True) as f:
        f.write(f"{total}\n")
    with fsspec.open(f"{cfg.output_path}/total.json", "w") as f:
        f.write(f'{{"total": {total}}}\n')
    print(f"total = {total}")


numbers = Step(name="demo/numbers", fn=write_numbers,
               config=WriteConfig(output_path=this_output_path(), n=10),
               description="write the numbers 0..n-1")
total = Step(name="demo/total", fn=sum_numbers,
             config=SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                              output_path=this_output_path()),
             description="add them up")

if __name__ == "__main__":
    executor_main(steps=[total], description="two-step demo")
