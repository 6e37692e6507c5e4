"""Build cost of `marin publish`: a full build and an incremental one after one changed step, plus the size
of a small real site.

    PYTHONPATH=. python benchmarks/publish_build.py [--experiments 1000] [--prefix P] [--site D] [--skip-lab]
                                                    [--cli]

Writes a synthetic prefix in the real on-storage format (tests.fakes.synthetic_prefix: `--experiments` x 20
steps; kept in --prefix when given, else a temporary directory), publishes every experiment (`[select] all`)
into a fresh directory, publishes again with nothing changed, appends one event to one step and publishes
again (the event's time is fixed, so two runs on copies of one prefix publish the same bytes: --site keeps the
site for benchmarks/publish_ab.py to compare). Then builds the site of a small real lab
(tests.publish.data_lab: a baseline, an ablation with a forecast, and an ingest -> tokenizer -> tokenize data
experiment, run by the real executor) and reports its bytes. Prints one JSON object with the seconds (wall,
and CPU of this process and its forked render workers), pages rendered and written per build, the site's files
and bytes, and the load average before and after (this machine is shared: compare runs made side by side; CPU
seconds move less with the load than wall seconds).
With --cli every build is a `marin publish ... --json` process (the installed `marin` script beside this
interpreter): its seconds are end to end, interpreter start and imports included, and its CPU seconds those
of the process and its workers.
Goals (issue 36): full build at 1,000 x 20 < 120 s on 2 cores, incremental after one changed step < 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from marin.publish.policy import parse_policy  # noqa: E402
from marin.publish.site import publish  # noqa: E402
from tests.fakes.synthetic_prefix import write_prefix  # noqa: E402

ALL = parse_policy({"select": {"all": True}})
BENCH_TS = 1_765_000_000.0  # the appended event's time: after every synthetic step's, the same in every run


def _size(out: Path) -> dict[str, int]:
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


CLI: list[str] = []
"""With --cli, the command each build runs (`marin publish ... --json`): timed end to end, interpreter start
and imports included."""


def _build(prefix: str, out: Path) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), _cpu()
    if CLI:
        done = subprocess.run([*CLI, "--prefix", prefix, "--out", str(out)], capture_output=True, text=True,
                              check=False)
        if done.returncode not in (0, 1):  # 1: the report lists problems (counted below)
            raise RuntimeError(f"{' '.join(CLI)} failed ({done.returncode}):\n{done.stderr}")
        r = json.loads(done.stdout)
        figures = {"pages": r["pages"], "rendered": len(r["rendered"]), "written": len(r["written"]),
                   "problems": len(r["problems"])}
    else:
        report = publish(prefix, str(out), ALL)
        figures = {"pages": report.pages, "rendered": len(report.rendered), "written": len(report.written),
                   "problems": len(report.problems)}
    return {"seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": round(_cpu() - c0, 2), **figures}


def _cli(work: Path) -> list[str]:
    """`marin publish --policy (every experiment) --json`, through the installed `marin` script when it is
    beside this interpreter (what a user runs), else `python -m marin`."""
    policy = work / "publish-all.toml"
    policy.write_text("[select]\nall = true\n")
    script = Path(sys.executable).with_name("marin")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "marin"]
    return [*head, "publish", "--policy", str(policy), "--json"]


def synthetic(prefix: Path, experiments: int, out: Path) -> dict[str, Any]:
    if not (prefix / "experiments").exists():
        t0 = time.perf_counter()
        write_prefix(str(prefix), experiments=experiments)
        print(f"wrote the synthetic prefix in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    full = _build(str(prefix), out)
    unchanged = _build(str(prefix), out)
    step = next(prefix.glob("sweep00/train/model0-*"))
    with open(step / ".marin" / "events.jsonl", "a") as f:
        event = {"ts": BENCH_TS, "event": "PREEMPTED", "attempt": 1, "message": "bench"}
        f.write(json.dumps(event) + "\n")
    incremental = _build(str(prefix), out)
    return {"experiments": experiments, "steps": experiments * 20, "full": full, "unchanged": unchanged,
            "incremental_one_step": incremental, "site": _size(out)}


def lab(work: Path) -> dict[str, Any]:
    from tests.publish.data_lab import write_site_lab

    prefix, _, _ = write_site_lab(work / "lab")
    out = work / "lab-site"
    return {"build": _build(prefix, out), "site": _size(out)}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--experiments", type=int, default=1000)
    p.add_argument("--prefix", default=None, help="keep the synthetic prefix here (reused when present)")
    p.add_argument("--site", default=None, help="build the synthetic site here (kept; default: temporary)")
    p.add_argument("--skip-lab", action="store_true")
    p.add_argument("--cli", action="store_true",
                   help="build through `marin publish` (a fresh interpreter each)")
    args = p.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="publish-bench-") as tmp:
        work = Path(tmp)
        if args.cli:
            CLI[:] = _cli(work)
        (work / "lab").mkdir()
        prefix = Path(args.prefix) if args.prefix else work / "prefix"
        site = Path(args.site) if args.site else work / "site"
        result: dict[str, Any] = {"synthetic": synthetic(prefix, args.experiments, site)}
        if not args.skip_lab:
            result["small_real_lab"] = lab(work)
    result["loadavg_before"], result["loadavg_after"] = list(load_before), list(os.getloadavg())
    result["cpus"], result["cli"] = os.cpu_count(), args.cli
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
