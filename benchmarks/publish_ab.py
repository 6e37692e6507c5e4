"""`marin publish` before and after a change, side by side on one machine, their sites compared byte for byte.

    git archive main | tar -x -C /tmp/publish-before
    python benchmarks/publish_ab.py --before /tmp/publish-before --experiments 200 [--rounds 2]

Writes one synthetic prefix (tests.fakes.synthetic_prefix, `--experiments` x 20 steps), then for each round
runs benchmarks/publish_build.py (this tree's copy, so both sides run the same benchmark) once with the
`--before` tree's code and once with this tree's, alternating, each on a fresh copy of the prefix with its own
build cache: a full build, a build with nothing changed, one appended event, an incremental build. Prints one
JSON object: each run's figures (wall and CPU seconds, pages rendered and written) and the load average, and
`identical`: whether the two sites hold the same files with the same bytes (publish-manifest.json compared by
its pages' content hashes, since its digests hold the renderer's code; the index's "published" time masked).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_PUBLISHED = re.compile(rb"A static snapshot published [0-9-]+ [0-9:]+Z:")


def _tree(site: Path) -> dict[str, bytes]:
    files = {p.relative_to(site).as_posix(): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    manifest = json.loads(files.pop("publish-manifest.json"))
    hashes = {k: v.get("sha256") for k, v in manifest["pages"].items() if k != "index.html"}  # masked below
    files["publish-manifest.json"] = json.dumps(hashes, sort_keys=True).encode()
    if "index.html" in files:
        files["index.html"] = _PUBLISHED.sub(b"A static snapshot published (time):", files["index.html"])
    return files


def _differences(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _run(tree: Path, prefix: Path, work: Path, tag: str, experiments: int) -> dict[str, Any]:
    run_prefix, site, cache = work / f"prefix-{tag}", work / f"site-{tag}", work / f"cache-{tag}"
    for path in (run_prefix, site, cache):
        shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(prefix, run_prefix, symlinks=True)
    script = tree / "benchmarks" / "publish_build.py"
    if tree != ROOT:  # the same benchmark on both sides
        shutil.copyfile(ROOT / "benchmarks" / "publish_build.py", script)
    env = {**os.environ, "MARIN_PUBLISH_CACHE": str(cache), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(script), "--experiments", str(experiments), "--prefix",
                          str(run_prefix), "--site", str(site), "--skip-lab"],
                         env=env, check=True, capture_output=True, text=True, cwd=tree)
    result: dict[str, Any] = json.loads(out.stdout)["synthetic"]
    result["loadavg"] = list(os.getloadavg())
    shutil.rmtree(run_prefix, ignore_errors=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--before", required=True, help="the tree to compare with (e.g. git archive main)")
    p.add_argument("--experiments", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--work", default=None, help="keep the prefix and both sites here (default: temporary)")
    args = p.parse_args()
    before = Path(args.before).resolve()
    with tempfile.TemporaryDirectory(prefix="publish-ab-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        prefix = work / "prefix"
        if not (prefix / "experiments").exists():
            subprocess.run([sys.executable, "-m", "tests.fakes.synthetic_prefix", str(prefix),
                            "--experiments", str(args.experiments)], check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        diffs: list[str] = []
        for _ in range(args.rounds):
            runs["before"].append(_run(before, prefix, work, "before", args.experiments))
            runs["after"].append(_run(ROOT, prefix, work, "after", args.experiments))
            diffs = _differences(_tree(work / "site-before"), _tree(work / "site-after"))
    result = {"experiments": args.experiments, "steps": args.experiments * 20, "runs": runs,
              "identical": not diffs, "differing_files": diffs[:20], "cpus": os.cpu_count()}
    print(json.dumps(result, indent=1))
    return 0 if not diffs else 1


if __name__ == "__main__":
    raise SystemExit(main())
