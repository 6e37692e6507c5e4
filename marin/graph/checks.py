"""Checks of every step's config before anything runs: what a worker would parse, parsed by the driver.

A config class may define `check(self) -> None` that raises ValueError (or TypeError, KeyError) for a
config the step function would refuse: an override naming no field, an unknown preset. The train operator's
parses its preset, `model` and `overrides` exactly as the run does, and names the closest valid field
("did you mean"). `check_configs` calls it on every step of the DAG with the config resolved as the worker
will see it (placeholders replaced by the output paths under the prefix; nothing is read from them), and
raises one StepDefinitionError that names every step, its field and the fix. `marin plan` and every run call
it after building the DAG, so a typo costs a second instead of a failed step minutes into a run.
"""

from __future__ import annotations

from typing import Any

from marin.definition.identity import resolve
from marin.definition.step import Step
from marin.errors import StepDefinitionError
from marin.graph.dag import Graph, build_graph

CHECK = "check"  # the config method's name


def _checker(config: Any) -> Any:
    method = getattr(type(config), CHECK, None)
    return method if callable(method) else None


def check_configs(graph: Graph, prefix: str) -> None:
    """Run every step config's `check()` (see the module docstring); StepDefinitionError on the first
    problems found, all of them listed."""
    problems = []
    for node in graph.nodes:
        method = _checker(node.step.config)
        if method is None:
            continue

        def dep_path(step: Step) -> str:
            try:
                return graph.node_of(step).output_path(prefix)
            except KeyError:  # an equal step built elsewhere: the same identity, so the same path
                return build_graph([step], graph.raw_inputs).node_of(step).output_path(prefix)

        config = resolve(node.step.config, own_path=node.output_path(prefix), prefix=prefix,
                         dep_path=dep_path)
        try:
            method(config)
        except (ValueError, TypeError, KeyError) as e:
            problems.append(f"step {node.name} ({node.hash[:8]}, {type(config).__name__}): {e}")
    if problems:
        raise StepDefinitionError(
            "a step's config does not pass its own check (the parsing the run would do when the step "
            "starts):\n  " + "\n  ".join(problems) + "\nFix: correct the named field in the experiment "
            "script; `marin plan SCRIPT` runs the same checks without running anything")
