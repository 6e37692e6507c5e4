"""Resource requests as named quantities, the feasibility check both backends run before anything is
submitted, the Ray task options of a request, and what this machine offers to the `local` backend.

A request is `{"CPU": n, "GPU": n, "memory": bytes, <custom>: n}` (Ray's names). A request that no single node
can ever satisfy is an `InfeasibleResourcesError` naming the step and the missing resource, instead of a step
that waits forever.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from marin.definition.step import Resources
from marin.errors import InfeasibleResourcesError
from marin.execution.placement import gang_problem

LOCAL_RESOURCES_ENV = "MARIN_LOCAL_RESOURCES"


def requested(resources: Resources) -> dict[str, float]:
    """One worker's request (one host's, for a gang step: TPU chips of the slice included)."""
    if resources.tpu is not None:
        resources = resources.per_host()
    out = {"CPU": float(resources.num_cpus)}
    if resources.num_gpus:
        out["GPU"] = float(resources.num_gpus)
    if resources.memory:
        out["memory"] = float(resources.memory)
    out.update({k: float(v) for k, v in resources.resources.items()})
    return {k: v for k, v in out.items() if v > 0}


def ray_task_options(
    num_cpus: float,
    num_gpus: float,
    memory: float | None,
    custom: Mapping[str, float],
    env: Mapping[str, str],
) -> dict[str, Any]:
    """One attempt task's Ray options (a plain step's task, a gang member's, or a gang's supervisor, which
    asks for no resources): its resources, its env, and `max_retries=0` with `retry_exceptions=False`, since
    the executor owns every retry (a task cut short by a lost node comes back as an interruption it records
    and re-submits as a new attempt; Ray's default of 3 retries re-ran it silently, under the same attempt
    number). Zero GPUs, no memory, no custom resources and an empty env leave their option out."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_retries": 0, "retry_exceptions": False}
    if num_gpus:
        options["num_gpus"] = num_gpus
    if memory:
        options["memory"] = memory
    if custom:
        options["resources"] = dict(custom)
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    return options


def check_feasible(requests: Sequence[tuple[str, Resources]], nodes: list[dict[str, float]],
                   fix: str) -> None:
    """Raise InfeasibleResourcesError listing every step whose request fits on no single node."""
    problems = []
    for name, res in requests:
        want = requested(res)
        if res.is_gang:
            problem = gang_problem(name, res, want, nodes)
            if problem:
                problems.append(problem)
            continue
        if any(all(node.get(k, 0.0) >= v for k, v in want.items()) for node in nodes):
            continue
        missing = sorted(k for k, v in want.items() if not any(node.get(k, 0.0) >= v for node in nodes))
        detail = ", ".join(
            f"{k}={want[k]:g} (largest node has {max((n.get(k, 0.0) for n in nodes), default=0.0):g})"
            for k in (missing or sorted(want))
        )
        problems.append(f"step {name} requests {detail}")
    if problems:
        raise InfeasibleResourcesError(
            "resource requests no node can ever satisfy:\n  " + "\n  ".join(problems) + f"\nFix: {fix}"
        )


def _visible_gpus() -> float:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # "" hides every GPU; "-1" too
        return float(len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    return float(len(glob.glob("/dev/nvidia[0-9]*")))


def local_machine() -> dict[str, float]:
    """What the `local` backend hands out: this machine's CPUs, visible NVIDIA GPUs and memory, plus custom
    resources declared as JSON in MARIN_LOCAL_RESOURCES (e.g. '{"TPU": 4}' on a TPU VM)."""
    out = {"CPU": float(os.cpu_count() or 1),
           "memory": float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}
    gpus = _visible_gpus()
    if gpus:
        out["GPU"] = gpus
    declared = os.environ.get(LOCAL_RESOURCES_ENV)
    if declared:
        try:
            extra = json.loads(declared)
            if not isinstance(extra, dict) or not all(
                    isinstance(k, str) and isinstance(v, int | float) and v >= 0 for k, v in extra.items()):
                raise ValueError("expected a JSON object of names to numbers >= 0")
        except ValueError as e:
            raise InfeasibleResourcesError(
                f"{LOCAL_RESOURCES_ENV}={declared!r} is not valid: {e}. Fix: set it to a JSON object such as "
                '\'{"TPU": 4}\'') from e
        out.update({k: float(v) for k, v in extra.items()})
    return out
