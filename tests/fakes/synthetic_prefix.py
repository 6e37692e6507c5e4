"""Write a synthetic prefix through the engine's own writers (for the dashboard tests and its load benchmark).

`python -m tests.fakes.synthetic_prefix PREFIX --experiments 1000` writes 1,000 experiments of 20 steps each:
4 tokenize shards -> merge -> 5 train steps -> 5 evals -> 5 reports, every step with status.json,
events.jsonl, step.json and a log; train steps also get metrics.jsonl (with expert load) and wandb.json,
eval steps eval.json. Experiments reuse 50 step-name groups (`groups`) with different learning rates, so
steps have previous versions to compare with. Every tenth experiment fails (a train step FAILED, its
dependents DEP_FAILED) and every tenth+1 is still running.

Nothing here formats a status file by hand: the steps are real `Step`s, their graph, hashes and identities
come from `marin.graph.build_graph`, step.json from `marin.status.stepinfo.step_info`, status.json and
events.jsonl from `marin.status.files`, the manifest from `marin.status.manifest` (with a synthetic clock:
experiment i is created at BASE_TIME + 600 s * i). A format change in those writers reaches this data too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from typing import Any, ClassVar

from marin import Step, jsonio, output_path_of, this_output_path
from marin.graph.dag import Graph, Node, build_graph
from marin.status import files as sf
from marin.status import manifest
from marin.status.stepinfo import step_info
from marin.storage import Storage, storage_for

STEPS_PER_EXPERIMENT = 20
BASE_TIME = 1_764_000_000.0
DOMAINS = ("python", "prose", "math")
EXECUTOR = "bench:1:abcd1234"


@dataclasses.dataclass(frozen=True)
class TokenizeConfig:
    shard: int
    vocab_size: int
    output_path: str = this_output_path()
    kind: ClassVar[str] = "tokenize"


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    inputs: tuple[str, ...]
    shuffle_seed: int
    output_path: str = this_output_path()
    kind: ClassVar[str] = "merge"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    input_path: str
    lr: float
    num_experts: int
    layers: int
    seed: int
    output_path: str = this_output_path()
    kind: ClassVar[str] = "train"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    checkpoint_path: str
    domains: tuple[str, ...]
    output_path: str = this_output_path()
    kind: ClassVar[str] = "eval"


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    eval_path: str
    format: str
    output_path: str = this_output_path()
    kind: ClassVar[str] = "report"


def write_config(cfg: Any) -> None:
    """The step function of every synthetic step, should one be run: it records its config."""
    os.makedirs(cfg.output_path, exist_ok=True)
    with open(os.path.join(cfg.output_path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(cfg), f)


@dataclasses.dataclass(frozen=True)
class _Context:
    """What step.json records of the run (the executor's run context has the same fields)."""

    issue: str
    experiment_id: str
    provenance: dict[str, Any]


def _step(name: str, config: Any) -> Step:
    return Step(
        name=name, fn=write_config, config=config, description=f"{config.kind} step of a synthetic sweep"
    )


def _steps(i: int, groups: int) -> list[Step]:
    """Experiment i's 20 steps, dependencies first."""
    g = f"sweep{i % groups:02d}"
    lr = round(1e-3 * (1 + (i // groups) * 0.25), 6)
    shards = [
        _step(f"{g}/tokenize/shard{k}", TokenizeConfig(shard=k, vocab_size=512 * (1 + (i // 250))))
        for k in range(4)
    ]
    merge = _step(f"{g}/merge", MergeConfig(inputs=tuple(output_path_of(s) for s in shards), shuffle_seed=0))
    trains = [
        _step(
            f"{g}/train/model{j}",
            TrainConfig(input_path=output_path_of(merge), lr=lr * (j + 1), num_experts=8, layers=4, seed=i),
        )
        for j in range(5)
    ]
    evals = [
        _step(f"{g}/eval/model{j}", EvalConfig(checkpoint_path=output_path_of(t), domains=DOMAINS))
        for j, t in enumerate(trains)
    ]
    reports = [
        _step(f"{g}/report/model{j}", ReportConfig(eval_path=output_path_of(e), format="md"))
        for j, e in enumerate(evals)
    ]
    return [*shards, merge, *trains, *evals, *reports]


def _state(i: int, node: Node, failed: set[str], position: int) -> str | None:
    """The synthetic outcome of a step (None: never started)."""
    kind = node.step.config.kind
    if any(d.name in failed for d in node.deps):
        return "DEP_FAILED"
    if i % 10 == 0 and node.name.endswith("train/model2"):
        return "FAILED"
    if i % 10 == 1 and position >= 5:
        return {"train": "RUNNING", "eval": "WAITING"}.get(kind)
    return "SUCCESS"


def _error(state: str, node: Node, failed: set[str], prefix: str) -> dict[str, Any] | None:
    if state == "DEP_FAILED":
        dep = next(d for d in node.deps if d.name in failed)
        rel = os.path.relpath(dep.output_path(prefix), prefix)
        return {"type": "DependencyFailed", "message": f"dependency {dep.name} failed", "dependency": rel}
    if state == "FAILED":
        return {
            "type": "FloatingPointError",
            "message": "loss became NaN at step 12",
            "traceback": 'Traceback (most recent call last):\n  File "train.py", line 1\n'
            "FloatingPointError: loss became NaN",
        }
    return None


def _write_records(
    storage: Storage,
    prefix: str,
    node: Node,
    state: str,
    run_id: str,
    times: tuple[float, ...],
    error: dict[str, Any] | None,
) -> None:
    """status.json and events.jsonl of one attempt, through the executor's writers."""
    created, started, ended = times
    out = node.output_path(prefix)

    def event(name: str, message: str, ts: float) -> None:
        sf.append_event(
            storage, out, name, attempt=1, run_id=run_id, executor=EXECUTOR, message=message, ts=ts
        )

    event(sf.WAITING, "queued", created)
    ran = state in (sf.RUNNING, sf.SUCCESS, sf.FAILED)
    if ran:
        event(sf.RUNNING, "started", started)
        kind = node.step.config.kind
        storage.write_text(
            sf.log_path(out, 1), "".join(f"[{kind}] line {n} of step {node.name}\n" for n in range(40))
        )
    running = state in (sf.RUNNING, sf.WAITING)
    if not running:
        event(state, error["message"] if error else "done", ended)
    sf.write_status(
        storage,
        out,
        name=node.name,
        hash=node.hash,
        status=state,
        attempt=1,
        run_id=run_id,
        executor=EXECUTOR,
        previous={"created": created},
        started=started if ran else None,
        ended=None if running else ended,
        error=error,
        now=started if running else ended,
    )


def _write_outputs(storage: Storage, prefix: str, node: Node, state: str, i: int, metrics_rows: int) -> None:
    """What the operators would have written: metrics and W&B pointer of train steps, eval.json of evals."""
    out, kind = node.output_path(prefix), node.step.config.kind
    if kind == "train" and state != sf.WAITING:
        storage.write_text(f"{out}/metrics.jsonl", _metrics(metrics_rows, node.step.config.lr, i))
        rel = os.path.relpath(out, prefix)
        wandb = {
            "project": "marin",
            "run_id": rel.replace("/", "-"),
            "mode": "offline",
            "dir": f"{out}/wandb",
            "url": None,
        }
        storage.write_text(f"{out}/wandb.json", json.dumps(wandb))
    if kind == "eval" and state == sf.SUCCESS:
        storage.write_text(f"{out}/eval.json", json.dumps(_eval(i)))


def write_experiment(prefix: str, i: int, metrics_rows: int = 20, groups: int = 50) -> str:
    """Write synthetic experiment i under the (local) `prefix`; returns its id."""
    storage = storage_for(prefix)
    created = BASE_TIME + i * 600.0
    user = ("alice", "bob", "carol", "dan")[i % 4]
    ctx = _Context(
        issue=f"marin-community/marin#{100 + i % 37}",
        experiment_id=f"exp{100 + i % 37}_sweep-{i:08x}",
        provenance={
            "git_commit": f"{i:040x}",
            "git_dirty": False,
            "packages": {"marin-openlab": "0.1.0"},
            "host": "bench-host",
            "user": user,
        },
    )
    graph = build_graph(_steps(i, groups))
    run_id = f"run-{i:06d}"
    manifest.start_run(
        storage,
        prefix,
        ctx.experiment_id,
        script=f"experiments/exp{100 + i % 37}_sweep.py",
        description=f"learning-rate sweep {i} ({user})",
        issue=ctx.issue,
        provenance=ctx.provenance,
        steps=_manifest_steps(graph, prefix),
        run_id=run_id,
        args=["--prefix", prefix],
        now=created,
    )
    failed: set[str] = set()
    t = created
    for position, node in enumerate(graph.nodes):
        out = node.output_path(prefix)
        if (sf.read_status(storage, out) or {}).get("status") == sf.SUCCESS:
            continue  # shared with an earlier experiment of its group: an executor would reuse it too
        info = step_info(node, out, _resolved(node, prefix), lambda d: d.output_path(prefix), ctx)
        jsonio.write_json(storage, sf.step_json_path(out), {**info, "created": created})
        state = _state(i, node, failed, position)
        if state in (sf.FAILED, sf.DEP_FAILED):
            failed.add(node.name)
        if state is None:
            continue
        started, ended = t, t + 5.0 + position
        t = ended
        _write_records(
            storage,
            prefix,
            node,
            state,
            run_id,
            (created, started, ended),
            _error(state, node, failed, prefix),
        )
        _write_outputs(storage, prefix, node, state, i, metrics_rows)
    if i % 10 != 1:
        manifest.end_run(
            storage, prefix, ctx.experiment_id, run_id, "FAILED" if failed else "SUCCESS", [], now=t
        )
    return ctx.experiment_id


def _resolved(node: Node, prefix: str) -> Any:
    """The config with its placeholders replaced by real paths, as a worker would see it."""
    from marin.definition.identity import resolve

    by_step = {id(d.step): d for d in node.deps}
    return resolve(
        node.step.config,
        own_path=node.output_path(prefix),
        prefix=prefix,
        dep_path=lambda s: by_step[id(s)].output_path(prefix),
    )


def _manifest_steps(graph: Graph, prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "name": n.name,
            "hash": n.hash,
            "output_path": n.output_path(prefix),
            "dependencies": [d.hash for d in n.deps],
        }
        for n in graph.nodes
    ]


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
            domains = {
                d: {
                    "loss": 3.0 - s / rows,
                    "bpb": 1.2 - k * 0.1 - s / (4 * rows),
                    "tokens": 1000,
                    "bytes": 4000,
                }
                for k, d in enumerate(DOMAINS)
            }
            out.append(json.dumps({"step": s, "eval": {"domains": domains}}))
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
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("prefix")
    p.add_argument("--experiments", type=int, default=1000)
    p.add_argument("--metrics-rows", type=int, default=20)
    p.add_argument("--groups", type=int, default=50)
    args = p.parse_args(argv)
    prefix = os.path.abspath(args.prefix)
    ids = write_prefix(prefix, args.experiments, args.metrics_rows, args.groups)
    print(json.dumps({"prefix": prefix, "experiments": len(ids), "steps": len(ids) * STEPS_PER_EXPERIMENT}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
