"""Why an attempt ended without success: the causes, and how they are told apart.

| cause         | what happened                                                     | budget                 |
|---------------|-------------------------------------------------------------------|------------------------|
| `preempted`   | a node was drained for preemption (DRAIN_NODE_REASON_PREEMPTION), | `Step.max_preemptions` |
|               | or the worker process was killed by the system (not OOM)          |                        |
| `node_died`   | a node of the attempt died without notice (hard kill, lost VM)    | `Step.max_preemptions` |
| `driver_lost` | the executor itself was interrupted (SIGTERM, Ctrl-C)             | (the run ends)         |
| `oom`         | a worker was killed for running out of memory, or fn raised       | `Step.retries`         |
|               | MemoryError                                                       |                        |
| `failed`      | the step's function raised                                        | `Step.retries`         |

The decision uses **node liveness first**, never whichever error arrives first: in a JAX gang one dead host
makes the survivors fail too, often with a collective error (Gloo "connection closed by peer", or the JAX
coordination service aborting the process, which Ray reports as a crashed worker) that reaches the driver
before the dead node is reported. So if any node of the attempt is dead (or was drained for preemption), the
attempt was interrupted, whatever the members raised; only when every node is alive do the members' own
errors decide (an exception from the function beats a crashed worker, since a survivor's crash follows it).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection
from typing import Any

PREEMPTED, NODE_DIED, DRIVER_LOST, OOM, FAILED = "preempted", "node_died", "driver_lost", "oom", "failed"
CAUSES = (PREEMPTED, NODE_DIED, DRIVER_LOST, OOM, FAILED)
INTERRUPTIONS = (PREEMPTED, NODE_DIED, DRIVER_LOST)  # not the step's fault: retried under max_preemptions

# Ray's NodeDeathInfo.Reason values as `ray.nodes()` reports them in "DeathReason"
DEATH_REASONS = {
    0: "UNSPECIFIED",
    1: "EXPECTED_TERMINATION",
    2: "UNEXPECTED_TERMINATION",
    3: "AUTOSCALER_DRAIN_PREEMPTED",
    4: "AUTOSCALER_DRAIN_IDLE",
}


def is_interruption(cause: str | None) -> bool:
    return cause in INTERRUPTIONS


@dataclasses.dataclass(frozen=True)
class NodeState:
    """What the cluster says about one node an attempt ran on."""

    node_id: str
    ip: str
    alive: bool
    death_reason: str = "UNSPECIFIED"  # a DEATH_REASONS value, meaningful once the node is dead
    death_message: str = ""
    drained: bool = False  # seen draining (a preemption notice) while the attempt ran on it

    @property
    def preempted(self) -> bool:
        """Drained for preemption: Ray's death reason says so, or the node was seen draining while busy (Ray
        accepts only preemption drains for busy nodes, and a drained node killed before its deadline is
        reported as an unexpected termination)."""
        return self.death_reason == "AUTOSCALER_DRAIN_PREEMPTED" or self.drained


def node_states(
    nodes: list[dict[str, Any]], node_ids: list[str], drained: frozenset[str] | set[str] = frozenset()
) -> dict[str, NodeState]:
    """The states of `node_ids` read from `ray.nodes()` (and the ids seen draining); a node Ray no longer
    lists counts as dead."""
    by_id = {n.get("NodeID"): n for n in nodes}
    out = {}
    for node_id in node_ids:
        n = by_id.get(node_id)
        if n is None:
            out[node_id] = NodeState(
                node_id,
                "",
                alive=False,
                death_message="not listed by the cluster",
                drained=node_id in drained,
            )
            continue
        reason = n.get("DeathReason", 0)
        out[node_id] = NodeState(
            node_id,
            str(n.get("NodeManagerAddress", "")),
            alive=bool(n.get("Alive")),
            death_reason=DEATH_REASONS.get(reason, str(reason)) if isinstance(reason, int) else str(reason),
            death_message=str(n.get("DeathReasonMessage", "")),
            drained=node_id in drained,
        )
    return out


class MemberEnd(enum.StrEnum):
    """How one task of an attempt (a gang member, or a plain Ray task) ended, as far as Ray and the step's
    result tell. String-valued, so a kind compares equal to (and formats as) its name."""

    OK = "ok"  # fn returned and the attempt succeeded
    APP = "app"  # fn raised
    OOM = "oom"  # killed for running out of memory, or fn raised MemoryError
    NODE = "node"  # its node died
    CRASH = "crash"  # its worker process died
    CANCELLED = "cancelled"  # we cancelled it
    LEASE_LOST = "lease_lost"  # fn returned but the step's lease was lost meanwhile
    OTHER = "other"  # any other error


def error_kind(error: BaseException) -> MemberEnd:
    """One member's Ray-level end from the error its result raised (never `OK` or `LEASE_LOST`). Matches by
    class name so no Ray import is needed."""
    names = {c.__name__ for c in type(error).__mro__}
    if "OutOfMemoryError" in names:
        return MemberEnd.OOM
    if "NodeDiedError" in names:
        return MemberEnd.NODE
    if "TaskCancelledError" in names:
        return MemberEnd.CANCELLED
    if names & {"WorkerCrashedError", "ActorDiedError", "ActorUnavailableError", "LocalRayletDiedError"}:
        return MemberEnd.CRASH
    if "RayTaskError" in names:
        return MemberEnd.APP
    return MemberEnd.OTHER


def classify(ends: Collection[MemberEnd], nodes: dict[str, NodeState]) -> str:
    """The cause of an attempt's end from its members' ends (see `MemberEnd`) and the states of its nodes,
    liveness first (see the module docstring)."""
    dead = [s for s in nodes.values() if not s.alive]
    if any(s.preempted for s in dead):
        return PREEMPTED
    if dead or MemberEnd.NODE in ends:
        return NODE_DIED
    if MemberEnd.OOM in ends:
        return OOM
    if MemberEnd.APP in ends:
        return FAILED
    if MemberEnd.CRASH in ends or MemberEnd.OTHER in ends:
        return PREEMPTED  # the worker was killed by the system (not for memory) on a live node
    return FAILED
