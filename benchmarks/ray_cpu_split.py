"""The Ray backend's cost per run split into the driver's CPU and the Ray workers' CPU; prints JSON.

    scripts/netns .venv/bin/python benchmarks/ray_cpu_split.py                       # this checkout
    scripts/netns .venv/bin/python benchmarks/ray_cpu_split.py --ab 8a6e37e --pairs 4  # against a revision

`executor_overhead.py` reports the Ray backend's wall time and the CPU of the whole process tree, and its
ratio to raw Ray tasks; on a 2-core machine both move by 20-30% between back-to-back runs of one tree, and
they cannot say whether a change costs in the executor's process or in the workers that run each attempt.
This runs a DAG of no-op steps (`--shape`, `--n` steps) `--reps` times on a fresh embedded Ray (after a
warm-up run that starts the worker pool and imports marin in the workers) and reports, per run, the wall
time, the CPU of this process (the executor's scheduling loop, its Ray result thread and Ray's own driver
threads) and the CPU of every descendant process (Ray's workers, raylet and GCS). `--ab REV` runs a worktree
of REV and this checkout alternately (before-after, after-before, ...), each in a fresh interpreter that
imports marin from the tree it measures, and reports each side's median and the median of the pairs'
after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
PARTS = ("wall_s", "driver_cpu_s", "workers_cpu_s")


def _cpu_split() -> tuple[float, float]:
    import psutil

    me = psutil.Process()
    own = sum(me.cpu_times()[:2])
    workers = 0.0
    for proc in me.children(recursive=True):
        try:
            workers += sum(proc.cpu_times()[:2])
        except psutil.Error:  # exited meanwhile
            continue
    return own, workers


def measure(tree: Path, shape: str, n: int, reps: int) -> list[dict[str, float]]:
    """Runs inside the measured tree's interpreter (``--inner``): one dict per run."""
    sys.path[:0] = [str(tree), str(tree / "benchmarks")]
    import executor_overhead as eo

    from marin.execution.ray_backend import ensure_ray

    ensure_ray(None)
    eo.raw_ray(20, "fan")
    prefix = tempfile.mkdtemp(prefix="marin-bench-split-")
    eo.time_run(20, shape, "ray", prefix)
    runs = []
    for rep in range(1, reps + 1):
        own0, workers0 = _cpu_split()
        wall = eo.time_run(n, shape, "ray", prefix, rep=rep)
        own1, workers1 = _cpu_split()
        runs.append({"wall_s": wall, "driver_cpu_s": round(own1 - own0, 3),
                     "workers_cpu_s": round(workers1 - workers0, 3)})
    return runs


def _side(tree: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    cmd = [sys.executable, __file__, "--inner", "--tree", str(tree), "--shape", args.shape,
           "--n", str(args.n), "--reps", str(args.reps)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"ray_cpu_split: the run in {tree} failed (rc {out.returncode}):\n"
                         f"{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _revision(tree: Path) -> dict[str, Any]:
    """The measured checkout: its commit and whether its working tree had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": git("rev-parse", "HEAD"), "dirty": dirty}


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {p: statistics.median(r[p] for r in runs) for p in PARTS}


def ab(rev: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="marin-ab-split-") as tmp:
        before_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "-q", "--detach", str(before_tree), rev],
                       check=True)
        try:
            sides: dict[str, list[list[dict[str, float]]]] = {"before": [], "after": []}
            for i in range(args.pairs):
                order = ("before", "after") if i % 2 == 0 else ("after", "before")
                for side in order:
                    sides[side].append(_side(before_tree if side == "before" else HERE, args))
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(before_tree)],
                           check=False)
    pair_meds = {s: [_medians(runs) for runs in sides[s]] for s in sides}
    out: dict[str, Any] = {"rev": rev, "after": _revision(HERE), "pairs": args.pairs, "reps": args.reps,
                           "shape": args.shape, "n": args.n}
    for part in PARTS:
        ratios = [a[part] / b[part] for a, b in zip(pair_meds["after"], pair_meds["before"], strict=True)]
        out[part] = {"before_median": statistics.median(r[part] for runs in sides["before"] for r in runs),
                     "after_median": statistics.median(r[part] for runs in sides["after"] for r in runs),
                     "pair_ratios": [round(x, 3) for x in ratios],
                     "after_over_before": round(statistics.median(ratios), 3)}
    out["samples"] = sides
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ab", metavar="REV", help="alternate this git revision (before) and this checkout")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5, help="runs of the DAG per side of a pair")
    parser.add_argument("--shape", choices=("chain", "fan"), default="fan")
    parser.add_argument("--n", type=int, default=1000, help="steps per DAG")
    parser.add_argument("--tree", default=str(HERE), help=argparse.SUPPRESS)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(measure(Path(args.tree), args.shape, args.n, args.reps)))
    elif args.ab:
        print(json.dumps(ab(args.ab, args), indent=1))
    else:
        runs = _side(HERE, args)
        print(json.dumps({"shape": args.shape, "n": args.n, **_medians(runs), "samples": runs}, indent=1))


if __name__ == "__main__":
    main()
