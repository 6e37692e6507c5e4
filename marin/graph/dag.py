"""Collect an experiment's DAG from the steps it names, check it, and compute every step's identity.

Everything here is iterative (explicit stacks, Kahn's algorithm), so a 10,000-step chain never meets
Python's recursion limit. Checks run before anything touches storage or Ray: unserializable config values,
lambdas and closures (in `Step`), and two different steps sharing one name. Identical steps (same hash) are
merged into one node.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from marin.definition.identity import direct_dependencies, identity_of, pinned_identity_of, step_hash
from marin.definition.placeholders import join
from marin.definition.step import Step
from marin.errors import StepDefinitionError
from marin.graph.raw_inputs import RawInputs, StepInputs

logger = logging.getLogger(__name__)


def is_absolute(path: str) -> bool:
    return "://" in path or path.startswith("/")


@dataclasses.dataclass(eq=False)
class Node:
    """A distinct step of the DAG with its identity (the hash decides; duplicates share one node)."""

    step: Step
    hash: str
    identity: dict[str, Any]
    deps: list[Node]
    content_hash: str  # the hash from name/version/config/deps, even when the path is pinned
    inputs: StepInputs | None = None  # its raw inputs, when the graph was built with a RawInputs reader
    definition_hash: str = ""  # the hash with no raw-input fingerprint here or upstream (the experiment's)

    def __post_init__(self) -> None:
        self.definition_hash = self.definition_hash or self.hash

    @property
    def name(self) -> str:
        return self.step.name

    def output_path(self, prefix: str) -> str:
        pinned = self.step.output_path_override
        if pinned:
            return pinned if is_absolute(pinned) else join(prefix, pinned)
        return join(prefix, f"{self.step.name}-{self.hash[:8]}")


@dataclasses.dataclass
class Graph:
    """Nodes in topological order (dependencies first), plus the nodes the experiment named."""

    nodes: list[Node]
    targets: list[Node]
    warnings: list[str]
    _by_step: dict[int, Node]
    raw_inputs: RawInputs | None = None  # the reader the identities were built with (None: no fingerprints)

    def node_of(self, step: Step) -> Node:
        return self._by_step[id(step)]

    def dependents(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            for d in n.deps:
                out[id(d)].append(n)
        return out

    @property
    def experiment_hash(self) -> str:
        """sha256 over the sorted hashes of the experiment's steps (docs/formats.md), each without its raw
        inputs' fingerprints: new bytes at a raw input's path re-address the steps that read it, but the
        experiment keeps its id (its manifest, its run history, what `marin submit` described)."""
        import hashlib

        return hashlib.sha256("\n".join(sorted(n.definition_hash for n in self.nodes)).encode()).hexdigest()


def _collect(targets: Sequence[Step]) -> tuple[list[Step], dict[int, list[Step]]]:
    """All steps reachable from `targets` through placeholders, in topological order (iterative)."""
    found: dict[int, Step] = {}
    deps_of: dict[int, list[Step]] = {}
    stack = list(reversed(targets))  # popped in the order the experiment named them
    while stack:
        step = stack.pop()
        if id(step) in found:
            continue
        found[id(step)] = step
        deps = direct_dependencies(step)
        deps_of[id(step)] = deps
        stack.extend(d for d in reversed(deps) if id(d) not in found)
    indegree = {key: len(deps) for key, deps in deps_of.items()}
    users: dict[int, list[int]] = {key: [] for key in found}
    for key, deps in deps_of.items():
        for d in deps:
            users[id(d)].append(key)
    ready = deque(key for key in found if indegree[key] == 0)
    order: list[Step] = []
    while ready:
        key = ready.popleft()
        order.append(found[key])
        for user in users[key]:
            indegree[user] -= 1
            if indegree[user] == 0:
                ready.append(user)
    if len(order) != len(found):
        stuck = sorted(found[k].name for k, v in indegree.items() if v > 0)
        raise StepDefinitionError(f"the steps {stuck[:10]} form a dependency cycle; a step cannot use its "
                                  "own output")
    return order, deps_of


def build_graph(steps: Iterable[Step], raw_inputs: RawInputs | None = None) -> Graph:
    """Collect, check and hash the DAG reachable from `steps`. Raises StepDefinitionError before any I/O;
    then, with `raw_inputs`, fingerprints the steps' raw inputs into their identities (raw_inputs.py)."""
    targets = list(steps)
    for i, s in enumerate(targets):
        if not isinstance(s, Step):
            raise StepDefinitionError(f"steps[{i}] is a {type(s).__name__}, not a Step: pass Step objects")
    order, deps_of = _collect(targets)
    inputs_of = raw_inputs.read(order) if raw_inputs is not None else {}
    by_step: dict[int, Node] = {}
    by_hash: dict[str, Node] = {}
    by_name: dict[str, Node] = {}
    nodes: list[Node] = []
    warnings: list[str] = []
    for step in order:
        identity = identity_of(step, lambda d: by_step[id(d)].hash, deps_of[id(step)])
        inputs = inputs_of.get(id(step))
        component = inputs.identity_component() if inputs is not None else None
        if component:  # only steps with raw inputs under `rerun`: every other hash is as before issue 35
            identity["raw_inputs"] = component
        content_hash = step_hash(identity)
        hash_ = content_hash
        if step.output_path_override:
            hash_ = step_hash(pinned_identity_of(step))
            computed = f"{step.name}-{content_hash[:8]}"
            if step.output_path_override.rstrip("/").split("/")[-1] != computed.split("/")[-1]:
                warnings.append(
                    f"step {step.name}: pinned output path {step.output_path_override} differs from the "
                    "computed "
                    f"{computed}; the pinned path is used (its config and upstream changes are not "
                    "re-addressed)"
                )
        node = by_hash.get(hash_)
        if node is None:
            other = by_name.get(step.name)
            if other is not None:
                raise StepDefinitionError(
                    f"two different steps are named {step.name!r} (hashes {other.hash[:8]} and {hash_[:8]}); "
                    f"{_first_difference(other.identity, identity)}. Give them distinct names"
                )
            deps: list[Node] = []
            seen: set[int] = set()
            for d in deps_of[id(step)]:
                dn = by_step[id(d)]
                if id(dn) not in seen:
                    seen.add(id(dn))
                    deps.append(dn)
            node = Node(step, hash_, identity, deps, content_hash, inputs,
                         _definition_hash(step, hash_, bool(component), deps_of[id(step)], by_step))
            by_hash[hash_] = node
            by_name[step.name] = node
            nodes.append(node)
        by_step[id(step)] = node
    target_nodes: list[Node] = []
    for s in targets:
        if by_step[id(s)] not in target_nodes:
            target_nodes.append(by_step[id(s)])
    for w in warnings:
        logger.warning(w)
    return Graph(nodes, target_nodes, warnings, by_step, raw_inputs)


def _definition_hash(step: Step, hash_: str, fingerprinted: bool, deps: list[Step],
                     by_step: dict[int, Node]) -> str:
    """`hash_` as it would be with no raw-input fingerprint in this step or upstream (most steps: `hash_`)."""
    if step.output_path_override or not (fingerprinted or any(by_step[id(d)].definition_hash
                                                               != by_step[id(d)].hash for d in deps)):
        return hash_
    return step_hash(identity_of(step, lambda d: by_step[id(d)].definition_hash, deps))


def identity_hash(step: Step) -> str:
    """The identity hash of ``step`` from its config and its dependencies' hashes, as a plan computes them
    without reading raw inputs: the executor's hash for every step with no raw input (docs/concepts.md) here
    or upstream, else the step's `definition_hash` (what a record names as a run's config hash; raises
    StepDefinitionError like a plan)."""
    return build_graph([step]).node_of(step).hash


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    from marin.graph.changes import identity_changes

    diffs = [c.describe() for c in identity_changes(a, b)]
    return f"they differ in {'; '.join(diffs[:3])}" if diffs else "they differ"
