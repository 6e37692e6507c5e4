"""`marin reproduce EXPERIMENT|OUTPUT_PATH --prefix OTHER [--from PREFIX]`: re-run recorded steps from their
record into another prefix and compare their outputs digest by digest.

1. The steps: every step of an experiment (its manifest under `--from`), or one step (its output path) and
   what it depends on. Their step.json gives the commit, the dirty tree's diff (`.marin/source.patch`,
   checked against its recorded sha256), the script (relative to the checkout's root) and the environment
   lock (marin/status/lock.py).
2. The code: a temporary clone of the current repository (`git clone --shared`, so the repository itself is
   not touched) checked out at the commit, with the patch applied (`git apply --binary`).
3. The environment: the current interpreter when its distributions and Python version match the lock
   (`environment: reused`); otherwise a fresh virtual environment built from the lock with `uv venv` and
   `uv pip install name==version ...` (the checkout's own packages come from the checkout; uv is found on
   PATH, beside this interpreter or as the `uv` package, `find_uv`; with `UV_OFFLINE=1` it installs only
   from its cache, which is how the tests build one without network), or, with
   `--env current`, the current interpreter anyway (the differences are recorded).
4. The run: `python SCRIPT --prefix OTHER --backend local --run-only ^name$ ...` in the checkout (its
   packages first on PYTHONPATH). Environment variables the script reads are passed through as they are now.
5. The comparison: per step, the reproduction must have the same hash (the same output path under OTHER) and
   the same files with the same digests - or, where the digests differ, the same bytes once each run's own
   prefix is replaced by `{prefix}` (outputs that record their paths) - except what the step declared
   `nondeterministic`: whole files (`checkpoints/*`) or keys of JSON/JSONL files
   (`metrics.jsonl#time,tokens_per_s`). The result is printed, appended to each original step's
   `.marin/reproductions.json`, and is the exit status (0 identical, 1 differs, 2 cannot reproduce).
W&B re-runs a recorded run's code and config; this also pins the bytes of the diff and checks the outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from marin.definition.placeholders import join
from marin.errors import MarinError
from marin.status.files import read_record, step_json_path
from marin.status.lock import PATCH_FILE, differences, environment_lock
from marin.status.manifest import manifest_path
from marin.storage.base import Storage
from marin.storage.fs import normalize_prefix, storage_for
from marin.storage.outputs import read_manifest

RECORD = ".marin/reproductions.json"


class ReproduceError(MarinError):
    """The record does not allow a reproduction (no commit, a patch over the cap, a missing commit...)."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    hash: str
    output_path: str


@dataclasses.dataclass(frozen=True)
class StepComparison:
    name: str
    result: str  # "identical" or "differs"
    detail: str
    differences: tuple[str, ...] = ()


def targets_of(storage: Storage, source: str, target: str) -> list[Target]:
    """The steps named by an experiment id (its manifest) or an output path (it and its dependencies)."""
    manifest = read_record(storage, manifest_path(source, target))
    if manifest is not None:
        return [Target(str(s["name"]), str(s["hash"]), str(s["output_path"]))
                for s in manifest.get("steps", [])]
    path = target if target.startswith("/") or "://" in target else join(source, target)
    out: dict[str, Target] = {}
    stack = [path.rstrip("/")]
    while stack:
        p = stack.pop()
        info = read_record(storage, step_json_path(p))
        if info is None:
            raise ReproduceError(f"{target!r} is neither an experiment under {source} (experiments/*.json) "
                                 f"nor a step's output path ({p}/.marin/step.json is missing)")
        out.setdefault(p, Target(str(info["name"]), str(info["hash"]), p))
        stack.extend(str(d["output_path"]) for d in info.get("dependencies") or []
                     if d["output_path"] not in out)
    return list(reversed(out.values()))


def _git(*args: str, cwd: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReproduceError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def checkout(storage: Storage, step_path: str, info: dict[str, Any], workdir: str) -> str:
    """A clone of the current repository at the recorded commit with the recorded patch applied."""
    commit = info.get("git_commit")
    if not commit:
        raise ReproduceError(f"step {info.get('name')} was run outside a git checkout (no git_commit in its "
                             "step.json): it cannot be rebuilt from its record")
    patch = info.get("git_patch")
    if isinstance(patch, dict) and patch.get("omitted"):
        raise ReproduceError(f"step {info.get('name')}: its dirty tree's diff was not kept "
                             f"({patch['omitted']})")
    repo = _git("rev-parse", "--show-toplevel", cwd=os.getcwd())
    _git("cat-file", "-e", f"{commit}^{{commit}}", cwd=repo)
    src = os.path.join(workdir, "src")
    _git("clone", "--quiet", "--shared", "--no-checkout", repo, src, cwd=workdir)
    _git("checkout", "--quiet", "--detach", str(commit), cwd=src)
    if isinstance(patch, dict):
        text = storage.read_text(join(step_path, f".marin/{PATCH_FILE}"))
        if text is None or hashlib.sha256(text.encode()).hexdigest() != patch.get("sha256"):
            raise ReproduceError(f"step {info.get('name')}: {step_path}/.marin/{PATCH_FILE} is missing or "
                                 "not the recorded diff (sha256 differs)")
        with open(os.path.join(workdir, PATCH_FILE), "w", encoding="utf-8") as f:
            f.write(text)
        _git("apply", "--binary", "--whitespace=nowarn", os.path.join(workdir, PATCH_FILE), cwd=src)
    return src


def interpreter(lock: dict[str, Any], src: str, workdir: str, mode: str) -> tuple[str, str, list[str]]:
    """(python executable, "reused" | "built" | "current", the differences from the lock)."""
    own = _own_distributions(src)
    current = environment_lock()
    diffs = [d for d in differences(lock, current) if d.split(" ", 1)[0] not in own]
    if not diffs or mode == "current":
        return sys.executable, "reused" if not diffs else "current", diffs
    uv = find_uv()
    if uv is None:
        raise ReproduceError("the current environment differs from the lock (" + "; ".join(diffs[:5])
                             + ") and uv is not installed to build one (looked on PATH, beside "
                             f"{sys.executable} and for the uv package). Fix: install uv, or pass "
                             "--env current")
    venv = os.path.join(workdir, "venv")
    pins = [f"{n}=={v}" for n, v in (lock.get("distributions") or {}).items() if n not in own]
    # the recorded Python: this interpreter when it is that version (found without a search, offline too)
    wanted = str(lock.get("python"))
    python = sys.executable if wanted == platform.python_version() else wanted
    for cmd in ([uv, "venv", "--quiet", "--python", python, venv],
                [uv, "pip", "install", "--quiet", "--python", os.path.join(venv, "bin", "python"), *pins]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            offline = " (UV_OFFLINE is set: only wheels in uv's cache can be installed)" \
                if os.environ.get("UV_OFFLINE") else ""
            raise ReproduceError(f"building the locked environment failed ({' '.join(cmd[1:3])}){offline}: "
                                 f"{done.stderr.strip()[-500:]}. Fix: pass --env current to use this one")
    return os.path.join(venv, "bin", "python"), "built", diffs


def find_uv() -> str | None:
    """The uv executable: on PATH, else beside this interpreter (a virtual environment's `bin/`, which need
    not be on PATH), else the `uv` package's own binary (what `python -m uv` runs); None when there is
    none."""
    found = shutil.which("uv")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "uv")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    try:
        import uv as uv_package  # type: ignore[import-not-found,unused-ignore]

        binary: str = uv_package.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None
    return binary


def _own_distributions(src: str) -> set[str]:
    """Distribution names the checkout itself provides (its pyproject files): they come from the checkout."""
    names = set()
    pyprojects = [os.path.join(src, "pyproject.toml"), *glob.glob(os.path.join(src, "lib/*/pyproject.toml"))]
    for pyproject in pyprojects:
        if os.path.exists(pyproject):
            with open(pyproject, encoding="utf-8") as f:
                found = re.search(r'^name\s*=\s*"([^"]+)"', f.read(), re.M)
            if found:
                names.add(found.group(1))
    return names


def run_steps(python: str, src: str, script: str, prefix: str, names: Sequence[str], log: str) -> None:
    """Run the script's named steps (and their dependencies) into `prefix` from the checkout."""
    paths = [src, *sorted(glob.glob(os.path.join(src, "lib/*/src")))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    cmd = [python, script, "--prefix", prefix, "--backend", "local", "--run-only",
           *[f"^{re.escape(n)}$" for n in names]]
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-2000:]
        raise ReproduceError(f"the reproduction run failed (exit {done.returncode}; log {log}):\n{tail}")


def rules(declared: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A step's `nondeterministic` declarations: whole-file globs, and (glob, keys) for JSON/JSONL files
    compared without those keys (`metrics.jsonl#time,tokens_per_s`; a key may be dotted: `work.wall_s`)."""
    whole, keyed = [], []
    for d in declared:
        glob_, _, keys = d.partition("#")
        if keys:
            keyed.append((glob_, [k for k in keys.split(",") if k]))
        else:
            whole.append(glob_)
    return whole, keyed


def _strip(value: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        *parents, last = key.split(".")
        node = value
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return value


def normalized(storage: Storage, path: str, prefix: str, keys: Sequence[str]) -> bytes:
    """A file's bytes with its run's prefix replaced by `{prefix}` (outputs that name their own paths), and
    the declared keys left out of each JSON object (a .json file, or every line of a .jsonl file)."""
    data = b"".join(storage.iter_bytes(path)).replace(prefix.encode(), b"{prefix}")
    if not keys:
        return data
    if path.endswith(".jsonl"):
        lines = [json.dumps(_strip(json.loads(x), keys), sort_keys=True)
                 for x in data.splitlines() if x.strip()]
        return "\n".join(lines).encode()
    return json.dumps(_strip(json.loads(data), keys), sort_keys=True).encode()


def compare(storage: Storage, other: Storage, source: str, prefix: str, t: Target) -> StepComparison:
    """The reproduction of `t` under `prefix` against the original's output manifest, file by file."""
    original = read_manifest(storage, t.output_path)
    if original is None:
        return StepComparison(t.name, "differs",
                              "the original has no output manifest (recorded before issue 35, or its "
                              "status is being rewritten or cannot be read)")
    path = join(prefix, f"{t.name}-{t.hash[:8]}")
    again = read_manifest(other, path)
    if again is None:
        return StepComparison(t.name, "differs", f"no reproduction at {path}: its identity differs (config, "
                              "raw inputs or code changed the hash)")
    whole, keyed = rules(original.get("nondeterministic") or ())
    names = sorted(n for n in set(original["entries"]) | set(again["entries"])
                   if not any(fnmatch.fnmatch(n, g) for g in whole))
    diffs = tuple(n for n in names if not _same(storage, other, (source, t.output_path), (prefix, path), n,
                                                 original["entries"], again["entries"], keyed))
    if diffs:
        return StepComparison(t.name, "differs", f"{len(diffs)} of {len(names)} file(s) differ", diffs)
    left_out = len(original["entries"]) - len(names)
    return StepComparison(t.name, "identical", f"{len(names)} file(s) identical"
                          + (f" ({left_out} declared non-deterministic left out)" if left_out else ""))


def _same(storage: Storage, other: Storage, a: tuple[str, str], b: tuple[str, str], name: str,
          want: dict[str, Any], got: dict[str, Any], keyed: list[tuple[str, list[str]]]) -> bool:
    if name not in want or name not in got:
        return False
    keys = [k for g, ks in keyed if fnmatch.fnmatch(name, g) for k in ks]
    if not keys and want[name].get("checksum") == got[name].get("checksum"):
        return True
    before = normalized(storage, join(a[1], name), a[0], keys)
    return before == normalized(other, join(b[1], name), b[0], keys)


def record(storage: Storage, t: Target, entry: dict[str, Any]) -> None:
    """Append the result to the original step's .marin/reproductions.json."""
    path = join(t.output_path, RECORD)
    current = read_record(storage, path) or {"schema": "marin-reproductions/v1", "reproductions": []}
    current["reproductions"].append(entry)
    storage.write_text(path, json.dumps(current, indent=1))


def reproduce(target: str, source: str, prefix: str, env_mode: str = "auto",
              keep: bool = False) -> dict[str, Any]:
    """Rebuild `target`'s steps from their record into `prefix`; returns the recorded result."""
    storage, other = storage_for(source), storage_for(prefix)
    targets = targets_of(storage, source, target)
    info = read_record(storage, step_json_path(targets[-1].output_path)) or {}
    script = info.get("script_path")
    if not script:
        raise ReproduceError(f"step {info.get('name')}: its step.json records no script_path (recorded "
                             "before issue 35, or outside a git checkout)")
    workdir = tempfile.mkdtemp(prefix="marin-reproduce-")
    try:
        src = checkout(storage, targets[-1].output_path, info, workdir)
        python, env_used, env_diffs = interpreter(info.get("environment") or {}, src, workdir, env_mode)
        log = os.path.join(workdir, "run.log")
        run_steps(python, src, str(script), prefix, [t.name for t in targets], log)
        results = [compare(storage, other, source, prefix, t) for t in targets]
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    outcome = "identical" if all(r.result == "identical" for r in results) else "differs"
    entry = {"at": time.time(), "prefix": prefix, "commit": info.get("git_commit"),
             "patch_sha256": (info.get("git_patch") or {}).get("sha256"), "environment": env_used,
             "environment_differences": env_diffs, "result": outcome,
             "steps": [dataclasses.asdict(r) for r in results]}
    for t in targets:
        record(storage, t, entry)
    return entry


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="marin reproduce", description=__doc__.split("\n")[0])
    parser.add_argument("target",
                        help="an experiment id (experiments/ID.json under --from) or a step's output path")
    parser.add_argument("--prefix", required=True, help="where the reproduction writes (another prefix)")
    parser.add_argument("--from", dest="source", default=None, help="the recorded run's prefix (default: "
                        "$MARIN_PREFIX, ./marin-out)")
    parser.add_argument("--env", choices=("auto", "current"), default="auto",
                        help="auto: reuse this interpreter if it matches the lock, else build one with uv")
    parser.add_argument("--keep", action="store_true", help="keep the temporary checkout")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(list(argv))
    source = normalize_prefix(args.source or os.environ.get("MARIN_PREFIX") or "./marin-out")
    prefix = normalize_prefix(args.prefix)
    if prefix == source:
        parser.error("--prefix must differ from the recorded run's prefix (--from)")
    try:
        entry = reproduce(args.target, source, prefix, args.env, args.keep)
    except ReproduceError as e:
        print(f"marin reproduce: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(entry, indent=1))
    else:
        print(f"reproduced {args.target} from {source} into {prefix} (commit {str(entry['commit'])[:12]}, "
              f"environment {entry['environment']}): {entry['result'].upper()}")
        for s in entry["steps"]:
            print(f"  {s['result']:<9} {s['name']}  {s['detail']}")
            print("".join(f"            {d}\n" for d in s["differences"][:10]), end="")
    return 0 if entry["result"] == "identical" else 1
