"""CPU per step of the local backend, this checkout against an earlier revision; prints one JSON object.

    python benchmarks/executor_cpu.py                          # this checkout: CPU of each figure
    python benchmarks/executor_cpu.py --ab 8a6e37e --pairs 7    # alternate an earlier revision and this one
    python benchmarks/executor_cpu.py --profile                # cProfile call counts instead of CPU

Figures, for a 1,000-step chain and fan-out (root -> N-2 independent steps -> sink) of no-op steps on the
local backend: the first run of a new DAG (the cheapest of `--firsts`, each of its own DAG), and the re-run
of a fully succeeded one (the cheapest of `--reruns`). CPU is user + system time from `getrusage` of the
process and its reaped children (the local backend's forked workers, reaped when the backend shuts down)
around `run_experiment`, so a loaded shared machine inflates it far less than wall time. Each figure splits
it: `executor_cpu_s` (the executor's process, every thread), `loop_thread_cpu_s` (the thread that called
`run_experiment`: planning and the scheduling loop; the rest of the process is the local backend's reaper
and the lease heartbeat) and `workers_cpu_s`; and again into `user_cpu_s` (the Python code: what a change to
the executor changes) and `system_cpu_s` (the kernel; on ext4 most of it is allocating the inodes of the
status files, a cost that depends on the filesystem's recent history more than on the code: run with
TMPDIR=/dev/shm to take the filesystem out).

Every measurement runs in a fresh interpreter that imports `marin` from the tree it measures, after a
20-step warm-up run (lazy imports and the worker pool's first fork are left out). `--ab` runs the two trees
alternately, `--pairs` times, in the order before-after, after-before, ... (a loaded machine's drift lands
on both sides of a pair, and so would anything one run leaves the next: on ext4 most of a no-op step's CPU
is the kernel allocating the status files' inodes, a cost that depends on the filesystem's recent history;
an A/A test of one tree against itself, 8 pairs in a fixed order, found no order effect, 1.007) and
reports each side's median, the median of the pairs' after/before ratios (also of each part of the CPU),
and each side's cheapest sample with their ratio: contention only ever adds CPU time (shared caches and
cores), so on a loaded machine the minimum is the steadiest figure. `--profile` counts the calls made by the
executor's thread (cProfile) during each figure instead, listing the functions called at least
`--min-calls` times, so two revisions' per-step work can be compared call by call (`--tree` picks the
checkout to import).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("chain_first", "fan_first", "chain_rerun", "fan_rerun")


@dataclasses.dataclass(frozen=True)
class NoopConfig:
    output_path: str
    inputs: tuple[str, ...] = ()


def noop(cfg: NoopConfig) -> None:
    """Does nothing: what remains is the executor's own cost."""


def _cpu() -> tuple[float, float, float]:
    """CPU seconds so far of this process (every thread), of its reaped children, and the kernel's part of
    both (file creation on ext4 is most of it)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, me.ru_stime + kids.ru_stime


def _measure(tree: str, n: int, firsts: int, reruns: int, profile: bool, min_calls: int) -> dict[str, Any]:
    """Run in a fresh interpreter whose `marin` comes from `tree` (see main)."""
    import marin

    assert os.path.dirname(os.path.abspath(marin.__file__)) == os.path.join(tree, "marin"), marin.__file__
    from marin import Step, output_path_of, run_experiment, this_output_path

    def config(*inputs: Step) -> NoopConfig:
        return NoopConfig(output_path=this_output_path(), inputs=tuple(output_path_of(s) for s in inputs))

    def chain(size: int, tag: str) -> list[Step]:
        prev = Step(name=f"{tag}/s0", fn=noop, config=config())
        for i in range(1, size):
            prev = Step(name=f"{tag}/s{i}", fn=noop, config=config(prev))
        return [prev]

    def fan(size: int, tag: str) -> list[Step]:
        root = Step(name=f"{tag}/root", fn=noop, config=config())
        middles = [Step(name=f"{tag}/m{i}", fn=noop, config=config(root)) for i in range(size - 2)]
        return [Step(name=f"{tag}/sink", fn=noop, config=config(*middles))]

    new_api = "config" in inspect.signature(run_experiment).parameters

    def run(steps: list[Step], prefix: str) -> Any:
        if new_api:
            from marin import ExecutorMainConfig

            return run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                                  script="bench_cpu.py")
        old_api: Any = run_experiment  # the keyword arguments of revisions before issue 12
        return old_api(steps, prefix=prefix, backend="local", verbose=False, script="bench_cpu.py")

    prefix = tempfile.mkdtemp(prefix="marin-bench-cpu-")
    assert run(chain(20, "warm"), prefix).status == "SUCCESS"
    out: dict[str, Any] = {}
    for shape, make in (("chain", chain), ("fan", fan)):
        dags = [make(n, f"{shape}{i}") for i in range(firsts)]  # distinct names: distinct steps, all new
        for figure, runs in ((f"{shape}_first", dags), (f"{shape}_rerun", [dags[0]] * reruns)):
            samples = []
            for steps in runs:
                os.sync()
                samples.append(_timed(lambda steps=steps: run(steps, prefix), profile, min_calls))
            out[figure] = min(samples, key=lambda s: s["cpu_s"])
    return out


def _timed(fn: Any, profile: bool, min_calls: int) -> dict[str, Any]:
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(fn)
        assert result.status == "SUCCESS", result.summary
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        calls = {f"{os.path.relpath(f, HERE) if f.startswith('/') else f}:{line}({name})": nc
                 for (f, line, name), (_, nc, *_rest) in stats.items() if nc >= min_calls}
        return {"cpu_s": 0.0, "calls": sum(v[1] for v in stats.values()),
                "functions": dict(sorted(calls.items(), key=lambda kv: -kv[1]))}
    (me0, kids0, sys0), w0, t0 = _cpu(), time.perf_counter(), time.thread_time()
    result = fn()
    wall, (me1, kids1, sys1), thread = time.perf_counter() - w0, _cpu(), time.thread_time() - t0
    system = sys1 - sys0
    assert result.status == "SUCCESS", result.summary
    return {"cpu_s": round(me1 - me0 + kids1 - kids0, 4), "executor_cpu_s": round(me1 - me0, 4),
            "loop_thread_cpu_s": round(thread, 4), "workers_cpu_s": round(kids1 - kids0, 4),
            "user_cpu_s": round(me1 - me0 + kids1 - kids0 - system, 4), "system_cpu_s": round(system, 4),
            "wall_s": round(wall, 4)}


def _child(tree: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--tree", tree, "--n", str(args.n),
           "--firsts", str(args.firsts), "--reruns", str(args.reruns), "--min-calls", str(args.min_calls),
           "--inner"]
    if args.profile:
        cmd.append("--profile")
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _ab(rev: str, args: argparse.Namespace) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="marin-cpu-ab-")
    tree = os.path.join(base, "tree")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "-q", "--detach", tree, rev], check=True)
    try:
        pairs = []
        for i in range(args.pairs):  # ABBA: which side runs first alternates, so an order effect cancels
            runs = {t: _child(t, args) for t in ((tree, HERE) if i % 2 == 0 else (HERE, tree))}
            pairs.append((runs[tree], runs[HERE]))
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", tree], check=True)
    out: dict[str, Any] = {"before": rev, "pairs": args.pairs, "n": args.n}
    for fig in FIGURES:
        before, after = [p[0][fig]["cpu_s"] for p in pairs], [p[1][fig]["cpu_s"] for p in pairs]
        ratios = [round(a / b, 3) for b, a in zip(before, after, strict=True)]
        out[fig] = {"before_cpu_s": statistics.median(before), "after_cpu_s": statistics.median(after),
                    "before_us_per_step": round(statistics.median(before) / args.n * 1e6, 1),
                    "after_us_per_step": round(statistics.median(after) / args.n * 1e6, 1),
                    "after_over_before": round(statistics.median(ratios), 3), "ratios": ratios,
                    # the cheapest of every sample: what contention (which only ever adds) inflates least
                    "before_min_us_per_step": round(min(before) / args.n * 1e6, 1),
                    "after_min_us_per_step": round(min(after) / args.n * 1e6, 1),
                    "min_after_over_min_before": round(min(after) / min(before), 3)}
        for part in ("executor_cpu_s", "loop_thread_cpu_s", "workers_cpu_s", "user_cpu_s", "system_cpu_s"):
            if all(part in p[0][fig] for p in pairs):  # not in --profile runs
                out[fig][f"{part}_after_over_before"] = round(statistics.median(
                    p[1][fig][part] / max(p[0][fig][part], 1e-9) for p in pairs), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ab", metavar="REV", help="alternate this git revision (before) and this checkout")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--n", type=int, default=1000, help="steps per DAG")
    parser.add_argument("--firsts", type=int, default=3, help="first runs per shape (each of a new DAG); "
                        "the cheapest is reported")
    parser.add_argument("--reruns", type=int, default=5, help="re-runs per DAG; the cheapest is reported")
    parser.add_argument("--profile", action="store_true", help="cProfile call counts instead of CPU")
    parser.add_argument("--min-calls", type=int, default=500, help="--profile: list functions called this "
                        "many times or more")
    parser.add_argument("--tree", default=HERE, help="the checkout to measure (default: this one)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ab and args.profile:
        parser.error("--profile counts calls of one tree: run it without --ab (and with --tree for another)")
    if args.inner:
        out = _measure(os.path.abspath(args.tree), args.n, args.firsts, args.reruns, args.profile,
                       args.min_calls)
    elif args.ab:
        out = _ab(args.ab, args)
    else:
        out = _child(os.path.abspath(args.tree), args)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
