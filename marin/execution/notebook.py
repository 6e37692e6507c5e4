"""Freezing an experiment's notebook (hypothesis, criteria, tags) against its DAG, before anything runs.

`freeze(notebook, graph)` checks every name a criterion uses against the DAG (the metric's step, a baseline
step) and returns the record the manifest keeps under `notebook` (docs/formats.md): step names resolved to
their hashes, baselines to one of four kinds (`step`, `metric`, `experiment`, `value`), and `sha256` over the
record's canonical JSON. Paths under the prefix are not part of it: the verdict finds a step's output path
in the manifest's `steps`, so the same notebook hashes the same under every prefix.

The record is frozen by the experiment's first run (`manifest.start_run` refuses a different one for the
same experiment id, see docs/notebook.md).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from marin.definition.criterion import Criterion, Notebook, is_metric, split_metric
from marin.definition.step import Step
from marin.errors import StepDefinitionError
from marin.graph.dag import Graph, Node, build_graph
from marin.jsonio import canonical_sha256
from marin.status import files as sf
from marin.status import results, verdicts
from marin.status.manifest import manifest_path
from marin.storage.base import Storage

SCHEMA = "marin-notebook/v1"
UNHASHED = ("sha256", "frozen", "frozen_by")  # the manifest adds when and by which run it was frozen


def notebook_hash(record: dict[str, Any]) -> str:
    """sha256 of the record's canonical JSON without `sha256`, `frozen` and `frozen_by`."""
    body = {k: v for k, v in record.items() if k not in UNHASHED}
    return canonical_sha256(body)


def _names(graph: Graph) -> dict[str, Node]:
    return {n.name: n for n in graph.nodes}


def _step_node(graph: Graph, name: str, what: str) -> Node:
    node = _names(graph).get(name)
    if node is None:
        known = ", ".join(sorted(_names(graph))[:12])
        raise StepDefinitionError(f"{what} names step {name!r}, which is not in this experiment's DAG "
                                  f"(steps: {known}). Fix: name one of them, or add the step to "
                                  "executor_main's steps")
    return node


def _baseline_node(graph: Graph, step: Step) -> Node:
    try:
        return graph.node_of(step)
    except KeyError:
        pass
    # an equal step built elsewhere has the same identity (its raw inputs read as the graph's were)
    wanted = build_graph([step], graph.raw_inputs).node_of(step).hash
    for node in graph.nodes:
        if node.hash == wanted:
            return node
    raise StepDefinitionError(f"Criterion.baseline is step {step.name!r}, which is not in this experiment's "
                              "DAG. Fix: add it to executor_main's steps, so its metric exists when the "
                              "verdict is computed")


def _baseline(graph: Graph, c: Criterion) -> dict[str, Any]:
    b = c.baseline
    if isinstance(b, Step):
        node = _baseline_node(graph, b)
        return {"kind": "step", "step": node.name, "hash": node.hash, "path": c.path,
                "label": f"{node.name}:{c.path}"}
    if isinstance(b, int | float):
        return {"kind": "value", "value": float(b), "label": f"fixed {float(b):g}"}
    if is_metric(b):
        step, path = split_metric(b, "Criterion.baseline")
        node = _step_node(graph, step, "Criterion.baseline")
        return {"kind": "metric", "step": node.name, "hash": node.hash, "path": path, "label": b}
    if b in _names(graph):
        node = _names(graph)[b]
        return {"kind": "step", "step": node.name, "hash": node.hash, "path": c.path,
                "label": f"{node.name}:{c.path}"}
    return {"kind": "experiment", "experiment": b, "path": c.path, "label": f"experiment {b}"}


def _check_declared(node: Node, path: str, what: str, written: str) -> None:
    """Refuse a metric path that the step's config says it never writes (marin/status/results.py)."""
    declared = results.declared(node.step.config)
    closest = results.check_path(declared, path)
    if closest is None:
        return
    shown = ", ".join(declared[:8]) + (", ..." if len(declared) > 8 else "")
    raise StepDefinitionError(
        f"{what} = {written!r}: step {node.name} ({type(node.step.config).__name__}) writes no {path!r} "
        f"(it declares {shown}). Fix: did you mean '{node.name}:{closest}'? A criterion can be corrected "
        "until its first verdict is recorded (docs/notebook.md)")


def criterion_record(graph: Graph, c: Criterion) -> dict[str, Any]:
    node = _step_node(graph, c.step, "Criterion.metric")
    _check_declared(node, c.path, "Criterion.metric", c.metric)
    baseline = _baseline(graph, c)
    if baseline.get("kind") in ("step", "metric"):
        _check_declared(_names(graph)[baseline["step"]], baseline["path"], "Criterion.baseline",
                        str(baseline["label"]))
    return {"metric": c.metric, "step": node.name, "hash": node.hash, "path": c.path, "better": c.better,
            "min_effect": float(c.min_effect), "baseline": baseline}


def freeze(notebook: Notebook, graph: Graph) -> dict[str, Any] | None:
    """The manifest's `notebook` record, or None when the experiment declares nothing."""
    if notebook.empty:
        return None
    record: dict[str, Any] = {"schema": SCHEMA, "hypothesis": notebook.hypothesis,
                              "criteria": [criterion_record(graph, c) for c in notebook.criteria],
                              "tags": sorted(set(notebook.tags))}
    record["sha256"] = notebook_hash(record)
    return record


def judge_run(storage: Storage, prefix: str, experiment_id: str, run_id: str,
              errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Compute and record the verdict of a run's experiment (when it declares a notebook), before the final
    status is published, so the issue and the dashboard show it with the run's end. A failure here is
    reported like a publisher's (in `errors`), never a failure of the run."""
    try:
        manifest = sf.read_record(storage, manifest_path(prefix, experiment_id)) or {}
        if not manifest.get("notebook"):
            return None
        entry = verdicts.judge(storage, prefix, manifest, run_id=run_id)
        return verdicts.record(storage, prefix, experiment_id, entry)
    except Exception as e:  # the verdict is a report on the run: it must not fail it
        errors.append({"publisher": "verdict", "ts": time.time(), "final": True,
                       "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return None
