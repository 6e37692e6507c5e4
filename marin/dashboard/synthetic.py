"""Write a synthetic prefix in the exact on-storage format of docs/formats.md (for the load benchmark and demos).

`python -m marin.dashboard.synthetic PREFIX --experiments 1000` writes 1,000 experiment manifests of 20 steps
each: 4 tokenize shards -> merge -> 5 train steps -> 5 evals -> 5 reports, every step with status.json,
events.jsonl, step.json and a log; train steps also get metrics.jsonl (with expert load) and wandb.json, eval
steps eval.json. Experiments reuse 50 step-name groups (`--groups`) with different learning rates, so steps have previous
versions to compare with. Every tenth experiment fails (a train step FAILED, its dependents DEP_FAILED) and
every tenth+1 is still running. Hashes are sha256 over the identity, as the executor computes them, but this is
not the executor: real runs are in the tests (tests/dashboard uses the executor when it is available).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from typing import Any

STEPS_PER_EXPERIMENT = 20
BASE_TIME = 1_764_000_000.0
DOMAINS = ("python", "prose", "math")


def _hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write(path: str, data: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)


def _plan(i: int, groups: int) -> list[tuple[str, str, dict[str, Any], list[str]]]:
    """(kind, name, config, dependency names) of experiment i's 20 steps."""
    g = f"sweep{i % groups:02d}"
    lr = round(1e-3 * (1 + (i // groups) * 0.25), 6)
    steps: list[tuple[str, str, dict[str, Any], list[str]]] = []
    shards = [f"{g}/tokenize/shard{k}" for k in range(4)]
    for k, name in enumerate(shards):
        steps.append(("tokenize", name, {"shard": k, "vocab_size": 512 * (1 + (i // 250))}, []))
    steps.append(("merge", f"{g}/merge", {"shuffle_seed": 0}, shards))
    for j in range(5):
        steps.append(
            (
                "train",
                f"{g}/train/model{j}",
                {"lr": lr * (j + 1), "num_experts": 8, "layers": 4, "seed": i},
                [f"{g}/merge"],
            )
        )
    for j in range(5):
        steps.append(("eval", f"{g}/eval/model{j}", {"domains": list(DOMAINS)}, [f"{g}/train/model{j}"]))
    for j in range(5):
        steps.append(("report", f"{g}/report/model{j}", {"format": "md"}, [f"{g}/eval/model{j}"]))
    return steps


def _state(i: int, kind: str, name: str, failed_deps: set[str], deps: list[str], position: int) -> str | None:
    if any(d in failed_deps for d in deps):
        return "DEP_FAILED"
    if i % 10 == 0 and name.endswith("train/model2"):
        return "FAILED"
    if i % 10 == 1:
        return (
            "SUCCESS"
            if position < 5
            else ("RUNNING" if kind == "train" else ("WAITING" if kind == "eval" else None))
        )
    return "SUCCESS"


def write_experiment(prefix: str, i: int, metrics_rows: int = 20, groups: int = 50) -> str:
    created = BASE_TIME + i * 600.0
    user = ("alice", "bob", "carol", "dan")[i % 4]
    issue = f"marin-community/marin#{100 + i % 37}"
    exp_id = f"exp{100 + i % 37}_sweep-{i:08x}"
    hashes: dict[str, str] = {}
    failed: set[str] = set()
    manifest_steps = []
    t = created
    for position, (kind, name, config, deps) in enumerate(_plan(i, groups)):
        identity = {
            "name": name,
            "version": None,
            "config": config,
            "dependencies": [hashes[d] for d in deps],
        }
        h = _hash(identity)
        hashes[name] = h
        rel = f"{name}-{h[:8]}"
        out = f"{prefix}/{rel}"
        state = _state(i, kind, name, failed, deps, position)
        if state in ("FAILED", "DEP_FAILED"):
            failed.add(name)
        manifest_steps.append(
            {"name": name, "hash": h, "output_path": out, "dependencies": [hashes[d] for d in deps]}
        )
        step_doc = {
            "name": name,
            "hash": h,
            "output_path": out,
            "fn": f"operators.{kind}:{kind}",
            "fn_source_hash": _hash({"k": kind}),
            "version": None,
            "description": f"{kind} step of synthetic experiment {i}",
            "config": {**config, "output_path": out},
            "identity": identity,
            "config_class": f"operators.{kind}:{kind.title()}Config",
            "dependencies": [
                {"name": d, "hash": hashes[d], "output_path": f"{prefix}/{d}-{hashes[d][:8]}"} for d in deps
            ],
            "resources": {"num_cpus": 1},
            "issue": issue,
            "experiment": exp_id,
            "git_commit": f"{i:040x}",
            "git_dirty": False,
            "packages": {"marin-openlab": "0.1.0"},
            "host": "bench-host",
            "user": user,
            "created": created,
        }
        _write(f"{out}/.marin/step.json", json.dumps(step_doc))
        if state is None:
            continue
        started, ended = t, t + 5.0 + position
        t = ended
        run_id = f"run-{i:06d}"
        events = [
            {
                "ts": created,
                "event": "WAITING",
                "attempt": 1,
                "run_id": run_id,
                "executor": "bench:1:abcd1234",
                "message": "queued",
            }
        ]
        error: dict[str, Any] | None = None
        if state == "DEP_FAILED":
            dep = next(d for d in deps if d in failed)
            error = {
                "type": "DependencyFailed",
                "message": f"dependency {dep} failed",
                "dependency": f"{dep}-{hashes[dep][:8]}",
            }
        if state in ("RUNNING", "SUCCESS", "FAILED"):
            events.append(
                {
                    "ts": started,
                    "event": "RUNNING",
                    "attempt": 1,
                    "run_id": run_id,
                    "executor": "bench:1:abcd1234",
                    "message": "started",
                }
            )
            _write(
                f"{out}/.marin/logs/attempt-1.log",
                "".join(f"[{kind}] line {n} of step {name}\n" for n in range(40)),
            )
        if state == "FAILED":
            error = {
                "type": "FloatingPointError",
                "message": "loss became NaN at step 12",
                "traceback": 'Traceback (most recent call last):\n  File "train.py", line 1\nFloatingPointError: loss became NaN',
            }
        if state not in ("RUNNING", "WAITING"):
            events.append(
                {
                    "ts": ended,
                    "event": state,
                    "attempt": 1,
                    "run_id": run_id,
                    "executor": "bench:1:abcd1234",
                    "message": error["message"] if error else "done",
                }
            )
        running = state in ("RUNNING", "WAITING")
        status = {
            "name": name,
            "hash": h,
            "status": state,
            "attempt": 1,
            "run_id": run_id,
            "executor": "bench:1:abcd1234",
            "created": created,
            "updated": ended if not running else started,
            "started": started if state in ("RUNNING", "SUCCESS", "FAILED") else None,
            "ended": None if running else ended,
            "error": error,
            "log": "logs/attempt-1.log",
        }
        _write(f"{out}/.marin/status.json", json.dumps(status))
        _write(f"{out}/.marin/events.jsonl", "".join(json.dumps(e) + "\n" for e in events))
        if kind == "train" and state != "WAITING":
            _write(f"{out}/metrics.jsonl", _metrics(metrics_rows, config["lr"], i))
            _write(
                f"{out}/wandb.json",
                json.dumps(
                    {
                        "project": "marin",
                        "run_id": rel.replace("/", "-"),
                        "mode": "offline",
                        "dir": f"{out}/wandb",
                        "url": None,
                    }
                ),
            )
        if kind == "eval" and state == "SUCCESS":
            _write(f"{out}/eval.json", json.dumps(_eval(i)))
    run_status = "FAILED" if failed else ("RUNNING" if i % 10 == 1 else "SUCCESS")
    manifest = {
        "id": exp_id,
        "script": f"experiments/exp{100 + i % 37}_sweep.py",
        "description": f"learning-rate sweep {i} ({user})",
        "issue": issue,
        "git_commit": f"{i:040x}",
        "user": user,
        "host": "bench-host",
        "created": created,
        "updated": t,
        "steps": manifest_steps,
        "runs": [
            {
                "run_id": f"run-{i:06d}",
                "started": created,
                "ended": None if run_status == "RUNNING" else t,
                "status": run_status,
                "user": user,
                "args": ["--prefix", prefix],
                "publisher_errors": [],
            }
        ],
    }
    _write(f"{prefix}/experiments/{exp_id}.json", json.dumps(manifest))
    return exp_id


def _metrics(rows: int, lr: float, seed: int) -> str:
    out = []
    for s in range(rows):
        load = [[(1 + math.sin(seed + layer * 3 + e + s / 10)) / 16 for e in range(8)] for layer in range(4)]
        row: dict[str, Any] = {
            "step": s,
            "loss": 6.0 * math.exp(-s / max(rows / 3, 1)) + 2.0,
            "lr": lr * min(1.0, (s + 1) / 10),
            "grad_norm": 1.5 * math.exp(-s / 50) + 0.2,
            "update_norm": lr * 10,
            "skipped": False,
            "clipped": s < 3,
            "tokens_per_s": 10000.0,
            "mfu": 0.3,
            "aux_loss": 0.01,
            "router_z_loss": 0.001,
            "logit_z_loss": 0.0,
            "drop_rate": 0.0,
            "expert_load": load,
            "routing_entropy": [2.0] * 4,
            "time": BASE_TIME + s,
        }
        out.append(json.dumps(row))
        if s and s % 10 == 0:
            out.append(
                json.dumps(
                    {
                        "step": s,
                        "eval": {
                            "domains": {
                                d: {
                                    "loss": 3.0 - s / rows,
                                    "bpb": 1.2 - k * 0.1 - s / (4 * rows),
                                    "tokens": 1000,
                                    "bytes": 4000,
                                }
                                for k, d in enumerate(DOMAINS)
                            }
                        },
                    }
                )
            )
    return "\n".join(out) + "\n"


def _eval(i: int) -> dict[str, Any]:
    domains = {
        d: {"loss": 2.5 + k * 0.2, "bpb": 0.9 + k * 0.1 + (i % 7) * 0.01, "tokens": 5000, "bytes": 20000}
        for k, d in enumerate(DOMAINS)
    }
    return {"domains": domains, "micro": {"bpb": 1.0}, "macro": {"bpb": 1.0}}


def write_prefix(prefix: str, experiments: int, metrics_rows: int = 20, groups: int = 50) -> list[str]:
    """Write `experiments` experiments; experiment i uses step-name group i % groups."""
    return [write_experiment(prefix, i, metrics_rows, groups) for i in range(experiments)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("prefix")
    p.add_argument("--experiments", type=int, default=1000)
    p.add_argument("--metrics-rows", type=int, default=20)
    p.add_argument("--groups", type=int, default=50)
    args = p.parse_args(argv)
    ids = write_prefix(os.path.abspath(args.prefix), args.experiments, args.metrics_rows, args.groups)
    print(
        json.dumps(
            {
                "prefix": os.path.abspath(args.prefix),
                "experiments": len(ids),
                "steps": len(ids) * STEPS_PER_EXPERIMENT,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
