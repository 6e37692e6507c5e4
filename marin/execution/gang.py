"""Gang steps on Ray: one attempt runs the step's function on several hosts at once, all or none.

An attempt of a gang step is one small **supervisor** task (no CPU, pinned to the driver's node, so it lives
as long as the executor does) that:

1. reserves the hosts in one placement group - all of them or none, so no host sits idle holding half a
   gang: `Resources(hosts=N)` is a STRICT_SPREAD group of N bundles (distinct nodes, each with the per-host
   resources); `Resources(tpu=..., slices=K)` goes through Ray's own `ray.util.tpu.slice_placement_group`,
   which first reserves each slice's `TPU-<type>-head` (worker 0) and then binds one bundle per host to that
   slice's name label. We use Ray's utility rather than Levanter's slice actor (an actor holding the head
   resource that starts one task per host through the slice-name resource) because it is the same
   placement-group path as `hosts=N` - one launch, one teardown (`remove_placement_group` frees every
   host), no long-lived actor to restart - and it already does multislice. A reservation that waits for
   capacity (after a node loss) is shown as waiting everywhere (gang_wait.py);
2. orders the members: slice, then the node's `ray.io/tpu-worker-id` label when it has one, then bundle.
   Rank 0 picks a free port on its own host when it starts and publishes it in Ray's internal key-value
   store (the GCS) under a key of this attempt; the other members read it there before they run the step.
   So every member's worker starts at once: a probe task for the port, run first in rank 0's bundle, cost
   a fresh worker start (2-5 s on a loaded 2-core machine) before any member could start;
3. starts one member task per bundle with `max_calls=1` (a process that initialised JAX's distributed
   runtime cannot do it again, and libtpu allows one process per host) and `max_retries=0` (the executor
   owns every retry), with `MARIN_GANG_SIZE`, `MARIN_GANG_RANK`, `MARIN_COORDINATOR` (`ip:port` of rank 0)
   and, for multislice, `MEGASCALE_COORDINATOR_ADDRESS`, `MEGASCALE_PORT`, `MEGASCALE_NUM_SLICES`,
   `MEGASCALE_SLICE_ID`. Only rank 0 gets the attempt's status record: it writes RUNNING and SUCCESS, and its
   log is `attempt-N.log`; rank k logs to `attempt-N.rank-k.log`;
4. waits, asking the GCS every second which member nodes are draining (a preemption notice; Ray reports a
   drained node killed before its deadline as an unexpected death, so this is remembered). Rank 0
   succeeding ends the attempt with success; the other members then get `MARIN_GANG_FINISH_S` (30 s) to
   end on their own (a member that is still flushing its shard of a checkpoint or its log is not killed
   mid-write, and a member that is still starting runs) before any still running are cancelled. The first
   member that fails, or whose node dies, ends it: every other member is cancelled at once, then the
   supervisor lets the picture settle (every member's result in, every node reported dead that a member
   died with, at most `MARIN_GANG_SETTLE_S`; a member whose worker crashed gives its node
   `MARIN_GANG_CRASH_SETTLE_S` to be reported dead, since a hard-killed host's worker is reported crashed
   seconds before the GCS's health check declares the node dead) and classifies the end from node
   liveness (`causes.classify`);
5. removes the placement group, whatever happened (also when the executor cancels the attempt: a
   non-forced cancel raises KeyboardInterrupt here, and the `finally` tears the gang down).

The whole protocol (supervisor, members, settling, the failure record) is one module, longer than most
(~470 lines), so that the failure semantics read in one place.
Why the file is past 400 lines: the launch, the watch and the classification of one gang attempt are one
protocol (the steps above), and they share the member records and the settle rules; each function is short.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from typing import Any

from marin.definition.step import Resources
from marin.definition.tpu import slice_shape
from marin.execution import causes
from marin.execution.attempt import HOST, AttemptResult, Outcome, StepRecord, Wire, results_from_wire
from marin.execution.causes import MemberEnd
from marin.execution.gang_wait import wait_for_hosts
from marin.execution.resources import ray_task_options, requested
from marin.execution.worker import execute_step

GANG_SIZE_ENV, GANG_RANK_ENV, COORDINATOR_ENV = "MARIN_GANG_SIZE", "MARIN_GANG_RANK", "MARIN_COORDINATOR"
MEGASCALE_PORT = "8081"
SETTLE_S = float(os.environ.get("MARIN_GANG_SETTLE_S", "60"))
CRASH_SETTLE_S = float(os.environ.get("MARIN_GANG_CRASH_SETTLE_S", "30"))
FINISH_S = float(os.environ.get("MARIN_GANG_FINISH_S", "30"))
PORT_WAIT_S = float(os.environ.get("MARIN_GANG_PORT_WAIT_S", "600"))  # rank k waits for rank 0's port
PORT_PENDING = "0"  # the coordinator's port until rank 0 has published it
KV_NAMESPACE = "marin_gang"
DRAIN_POLL_S = 1.0  # how often a running gang asks the GCS which nodes are draining
TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"


@dataclasses.dataclass(frozen=True)
class GangPlan:
    """How one gang step is laid out: per-member resources, how many, and the TPU slice shape if any."""

    size: int
    bundle: dict[str, float]  # one member's resources in Ray's names (CPU, GPU, memory, custom, TPU)
    tpu: str | None = None
    slices: int = 1

    @classmethod
    def of(cls, resources: Resources) -> GangPlan:
        return cls(
            size=resources.gang_size, bundle=requested(resources), tpu=resources.tpu, slices=resources.slices
        )

    @property
    def hosts_per_slice(self) -> int:
        return self.size // self.slices


@dataclasses.dataclass(frozen=True)
class Member:
    rank: int
    bundle: int
    node_id: str
    ip: str
    slice_id: int = 0


def member_env(member: Member, size: int, coordinator: str, slices: int) -> dict[str, str]:
    env = {GANG_SIZE_ENV: str(size), GANG_RANK_ENV: str(member.rank), COORDINATOR_ENV: coordinator}
    if slices > 1:
        env.update(
            {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator.rsplit(":", 1)[0],
                "MEGASCALE_PORT": MEGASCALE_PORT,
                "MEGASCALE_NUM_SLICES": str(slices),
                "MEGASCALE_SLICE_ID": str(member.slice_id),
            }
        )
    return env


def rank_log_path(log_path: str, rank: int) -> str:
    """Rank 0 logs to the attempt's log; rank k to `attempt-N.rank-k.log` beside it."""
    return (
        log_path
        if rank == 0
        else f"{log_path[:-4] if log_path.endswith('.log') else log_path}.rank-{rank}.log"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _reserve(ray: Any, plan: GangPlan, name: str) -> tuple[Any, Any]:
    """(placement group, object to shut down): all the gang's hosts, reserved together."""
    if plan.tpu is None:
        from ray.util.placement_group import placement_group

        bundles = [{k: v for k, v in plan.bundle.items()} for _ in range(plan.size)]
        pg = placement_group(bundles, strategy="STRICT_SPREAD", name=name)
        return pg, pg
    from ray.util.tpu import slice_placement_group

    shape = slice_shape(plan.tpu)
    handle = slice_placement_group(
        shape.topology,
        shape.generation,
        resources_per_bundle=dict(plan.bundle),
        num_slices=plan.slices,
        strategy="STRICT_SPREAD",
        name=name,
    )
    return handle.placement_group, handle


def _release(ray: Any, owner: Any) -> None:
    if owner is None:
        return
    with contextlib.suppress(Exception):
        if hasattr(owner, "shutdown"):
            owner.shutdown()
        else:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(owner)


def _members(ray: Any, pg: Any, plan: GangPlan) -> list[Member]:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg)["bundles_to_node_id"]
    nodes = {n["NodeID"]: n for n in ray.nodes()}
    rows = []
    for bundle in range(plan.size):
        node = nodes.get(table[bundle], {})
        worker_id = (node.get("Labels") or {}).get(TPU_WORKER_ID_LABEL)
        order = int(worker_id) if worker_id is not None and str(worker_id).isdigit() else bundle
        rows.append(
            (bundle // plan.hosts_per_slice, order, bundle, table[bundle], node.get("NodeManagerAddress", ""))
        )
    rows.sort()
    return [
        Member(rank, bundle, node_id, ip, slice_id)
        for rank, (slice_id, _, bundle, node_id, ip) in enumerate(rows)
    ]


def _strategy(pg: Any, bundle: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)


def member_options(plan: GangPlan, pg: Any, bundle: int, step_env: dict[str, str]) -> dict[str, Any]:
    """One member task's options (`resources.ray_task_options`), placed in its bundle of the gang's group."""
    custom = {k: v for k, v in plan.bundle.items() if k not in ("CPU", "GPU", "memory")}
    options = ray_task_options(
        plan.bundle.get("CPU", 0.0), plan.bundle.get("GPU", 0.0), plan.bundle.get("memory"), custom, step_env
    )
    options["scheduling_strategy"] = _strategy(pg, bundle)
    return options


class _DrainWatch:
    """The member nodes seen draining (the GCS's list of nodes with a drain request), polled while the gang
    runs: a drained node that is then killed before its deadline is reported by Ray as an unexpected death."""

    def __init__(self, ray: Any, node_ids: list[str]) -> None:
        self.node_ids = set(node_ids)
        self.seen: set[str] = set()
        try:
            from ray._raylet import GcsClient  # type: ignore[attr-defined]

            self._client: Any = GcsClient(address=ray.get_runtime_context().gcs_address)
        except Exception:  # no GCS client here: fall back to Ray's death reasons alone
            self._client = None

    def poll(self) -> set[str]:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self.seen |= self.node_ids & set(self._client.get_draining_nodes(timeout=5))
        return self.seen


def _outcome(ray: Any, ref: Any) -> tuple[MemberEnd, Any]:
    """(end, value) of a finished member: `OK`, `LEASE_LOST`, `APP`/`OOM` (fn raised), or a Ray-level end
    (causes.error_kind)."""
    try:
        value = ray.get(ref)
    except Exception as exc:
        return causes.error_kind(exc), exc
    if value.ok:
        return MemberEnd.OK, value
    if value.outcome is Outcome.LEASE_LOST:
        return MemberEnd.LEASE_LOST, value
    return (MemberEnd.OOM if value.cause == causes.OOM else MemberEnd.APP), value


def run_member(
    payload: bytes,
    shared: tuple[Any, str] | None,
    rank: int,
    gang_env: dict[str, str],
    log_path: str,
    port_key: str,
) -> AttemptResult:
    """A Ray task: one gang member. Rank 0 keeps the attempt's status record; the others write no status.
    Rank 0 publishes the coordinator's port under `port_key`; the others wait for it (`coordinator_port`)."""
    from marin.execution.attempt_pickle import load_attempt

    try:
        fn, config, _, env, record = load_attempt(payload, shared)
    except Exception as exc:  # e.g. the step's module is not importable on this node: a failure
        return AttemptResult.from_exception(
            exc, context=f"gang member {rank} cannot load the step's function and config", host=HOST
        )
    try:
        port = coordinator_port(_KV(), port_key, rank, PORT_WAIT_S)
    except TimeoutError as exc:
        return AttemptResult.from_exception(exc, context=f"gang member {rank} has no coordinator", host=HOST)
    host = gang_env[COORDINATOR_ENV].rsplit(":", 1)[0]
    gang_env = {**gang_env, COORDINATOR_ENV: f"{host}:{port}"}
    return execute_step(
        fn, config, rank_log_path(log_path, rank), {**env, **gang_env}, record if rank == 0 else None
    )


class _KV:
    """The attempt's port exchange through Ray's internal key-value store (kept in the GCS, reachable from
    every worker of the cluster; the same store Ray's own libraries use for small shared records)."""

    def __init__(self) -> None:
        from ray.experimental import internal_kv

        self._kv = internal_kv

    def put(self, key: str, value: str) -> None:
        self._kv._internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)

    def get(self, key: str) -> str | None:
        value = self._kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        return value.decode() if value is not None else None

    def del_(self, key: str) -> None:
        self._kv._internal_kv_del(key, namespace=KV_NAMESPACE)


def coordinator_port(kv: Any, key: str, rank: int, timeout_s: float, poll_s: float = 0.02) -> int:
    """Rank 0: a port free on this host, published under `key`. Rank k: the port rank 0 published, waited
    for up to `timeout_s` (rank 0's worker may start later; if it never does, the supervisor sees its end
    and cancels this member first). The wait asks the GCS every `poll_s` at first, backing off to every
    0.5 s, so the members of a large slice do not flood the GCS while rank 0's worker starts."""
    if rank == 0:
        port = _free_port()
        kv.put(key, str(port))
        return port
    deadline = time.monotonic() + timeout_s
    while (value := kv.get(key)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"gang rank 0 did not publish its coordinator port within {timeout_s:.0f} s")
        time.sleep(poll_s)
        poll_s = min(poll_s * 1.5, 0.5)
    return int(value)


_REMOTES: dict[str, Any] = {}


def _remote(fn: Any) -> Any:
    """The Ray remote function of `fn`, made once per process. Members are `max_calls=1`, which Ray accepts
    only in `ray.remote(...)`, not in `.options()`."""
    if fn.__name__ not in _REMOTES:
        import ray

        _REMOTES[fn.__name__] = ray.remote(max_calls=1)(fn) if fn is run_member else ray.remote(fn)
    return _REMOTES[fn.__name__]


def _start_failure(exc: Exception, log_path: str) -> AttemptResult:
    """The result of a gang that could not be started: an interruption if Ray lost a node (or a worker)
    meanwhile, else a failure."""
    kind = causes.error_kind(exc)
    cause = (
        causes.NODE_DIED
        if kind is MemberEnd.NODE
        else causes.PREEMPTED
        if kind in (MemberEnd.CRASH, MemberEnd.OTHER) and (type(exc).__module__.startswith("ray"))
        else causes.FAILED
    )
    return AttemptResult.from_exception(
        exc,
        outcome=Outcome.PREEMPTED if causes.is_interruption(cause) else Outcome.FAILED,
        context="could not start the gang",
        cause=cause,
        log_path=log_path,
    )


def supervise(
    payload: bytes,
    shared: tuple[Any, str] | None,
    plan: GangPlan,
    name: str,
    log_path: str,
    env: dict[str, str],
    *dependencies: Wire | None,
) -> Wire:
    """A Ray task: one attempt of a gang step (see the module docstring). Never raises for the step's sake;
    returns rank 0's result, or a failure record with `cause`, `preempted`, `hosts` and `gang`, as a wire
    tuple like every Ray attempt's (ray_backend.py); its dependencies' results come as such tuples too."""
    not_ok = [d for d in results_from_wire(dependencies) if d is None or not d.ok]
    if not_ok:
        return AttemptResult(
            Outcome.SKIPPED,
            error_type="DependencyNotSucceeded",
            log_path=log_path,
            message=f"a dependency's attempt did not succeed: {not_ok[0] and not_ok[0].message}",
        ).to_wire()
    import ray

    owner, port_key = None, ""
    refs: dict[Any, Member] = {}
    try:
        pg, owner = _reserve(ray, plan, name)
        wait_for_hosts(ray, pg.ready(), plan.size, plan.bundle, lambda: _record_of(payload, shared), name,
                       _KV())
        members = _members(ray, pg, plan)
        port_key = f"{name}:{uuid.uuid4().hex}"
        coordinator = f"{members[0].ip}:{PORT_PENDING}"
        started = time.time()
        for m in members:
            options = member_options(plan, pg, m.bundle, env)
            options["name"] = f"{name}:rank-{m.rank}"
            gang_env = member_env(m, plan.size, coordinator, plan.slices)
            ref = _remote(run_member).options(**options).remote(payload, shared, m.rank, gang_env, log_path,
                                                                port_key)
            refs[ref] = m
        return _watch(ray, refs, members, started).to_wire()
    except Exception as exc:  # reserving or launching failed: a node lost meanwhile is an interruption
        return _start_failure(exc, log_path).to_wire()
    finally:
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if port_key:
            with contextlib.suppress(Exception):
                _KV().del_(port_key)
        _release(ray, owner)


def _record_of(payload: bytes, shared: tuple[Any, str] | None) -> StepRecord | None:
    """The attempt's status record (what rank 0 writes from), for the supervisor's WAITING status."""
    from marin.execution.attempt_pickle import load_attempt

    try:
        record: StepRecord | None = load_attempt(payload, shared)[4]
    except Exception:  # not loadable here: rank 0 reports that; the wait is then shown on the driver only
        return None
    return record


def _watch(ray: Any, refs: dict[Any, Member], members: list[Member], started: float) -> AttemptResult:
    """Wait for rank 0's success or the first member's failure; on failure, settle and classify."""
    pending = dict(refs)
    outcomes: dict[int, tuple[MemberEnd, Any]] = {}
    first: Member | None = None
    drains = _DrainWatch(ray, [m.node_id for m in members])
    while pending and first is None:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=DRAIN_POLL_S)
        drains.poll()
        for ref in ready:
            m = pending.pop(ref)
            outcomes[m.rank] = _outcome(ray, ref)
            kind, value = outcomes[m.rank]
            ended_well = kind in (MemberEnd.OK, MemberEnd.LEASE_LOST)
            if ended_well and m.rank == 0 and isinstance(value, AttemptResult):
                if pending:  # the others end on their own, for a while, before the teardown cancels them
                    ray.wait(list(pending), num_returns=len(pending), timeout=FINISH_S)
                return value  # rank 0's result is the step's: it wrote (or may not write) SUCCESS
            if kind is not MemberEnd.OK and first is None:
                first = m
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    states = _settle(ray, pending, outcomes, members, drains)
    cause = causes.classify([kind for kind, _ in outcomes.values()], states)
    return _failure(cause, first or members[0], outcomes, states, members, started)


def _end_of(outcomes: dict[int, tuple[MemberEnd, Any]], member: Member) -> MemberEnd | None:
    """The member's end, or None while it has not ended."""
    return outcomes[member.rank][0] if member.rank in outcomes else None


def _settle(
    ray: Any,
    pending: dict[Any, Member],
    outcomes: dict[int, tuple[MemberEnd, Any]],
    members: list[Member],
    drains: _DrainWatch,
) -> dict[str, causes.NodeState]:
    """Collect the cancelled members' ends and wait until every node a member died with is reported dead
    (its death reason, or the GCS's draining list, says whether it was drained for preemption), for at most
    SETTLE_S. A member whose worker crashed may have lost its node too (a hard-killed host's worker is
    reported crashed before the GCS's health check declares the node dead): its node gets CRASH_SETTLE_S to
    be reported dead. A member that never answers its cancellation is on a node that cannot be reached: it
    counts as a node death."""
    begun = time.time()
    while True:
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.2)
            for ref in ready:
                outcomes[pending.pop(ref).rank] = _outcome(ray, ref)
        states = causes.node_states(ray.nodes(), [m.node_id for m in members], drains.poll())
        kind = {m.rank: _end_of(outcomes, m) for m in members}
        unsure = [
            m
            for m in members
            if states[m.node_id].alive
            and (
                kind[m.rank] is MemberEnd.NODE
                or (kind[m.rank] is MemberEnd.CRASH and time.time() - begun < CRASH_SETTLE_S)
            )
        ]
        if (not pending and not unsure) or time.time() - begun >= SETTLE_S:
            break
        if not pending:
            time.sleep(0.2)
    for m in pending.values():
        outcomes[m.rank] = (MemberEnd.NODE, None)
    return states


def _failure(
    cause: str,
    first: Member,
    outcomes: dict[int, tuple[MemberEnd, Any]],
    states: dict[str, causes.NodeState],
    members: list[Member],
    started: float,
) -> AttemptResult:
    """The attempt's end: the member error that explains it, the hosts involved, the cause."""
    dead = [m for m in members if not states[m.node_id].alive or _end_of(outcomes, m) is MemberEnd.NODE]
    outcome = Outcome.PREEMPTED if causes.is_interruption(cause) else Outcome.FAILED
    rank0 = outcomes[0][1] if 0 in outcomes else None
    begun = rank0.started if isinstance(rank0, AttemptResult) and rank0.started else started
    if causes.is_interruption(cause) and dead:
        hosts = tuple(m.ip for m in dead)
        what = (
            "was drained for preemption"
            if cause == causes.PREEMPTED and any(states[m.node_id].preempted for m in dead)
            else "died"
        )
        return AttemptResult(
            outcome,
            started=begun,
            ended=time.time(),
            cause=cause,
            hosts=hosts,
            host=HOST,
            error_type="NodeDied" if cause == causes.NODE_DIED else "Preempted",
            message=f"gang of {len(members)}: node {', '.join(hosts)} {what} "
            f"(rank {', '.join(str(m.rank) for m in dead)})",
        )
    wanted = (
        (MemberEnd.OOM,)
        if cause == causes.OOM
        else (MemberEnd.APP,)
        if cause == causes.FAILED
        else (MemberEnd.CRASH, MemberEnd.OTHER)
    )
    culprit = next((m for m in members if _end_of(outcomes, m) in wanted), first)
    kind, value = outcomes.get(culprit.rank, (MemberEnd.OTHER, None))
    if not isinstance(value, AttemptResult):
        value = AttemptResult.from_exception(
            value if isinstance(value, BaseException) else RuntimeError(f"gang member ended: {kind}")
        )
    oom = " (out of memory: lower the batch or ask for more memory per host)" if cause == causes.OOM else ""
    return dataclasses.replace(
        value,
        outcome=outcome,
        cause=cause,
        hosts=(culprit.ip,),
        started=begun,
        ended=time.time(),
        host=HOST,
        message=f"gang rank {culprit.rank} on {culprit.ip}: {value.message}{oom}",
    )


def submit_gang(
    ray: Any,
    plan: GangPlan,
    payload: bytes,
    shared: tuple[Any, str] | None,
    *,
    name: str,
    log_path: str,
    env: dict[str, str],
    after: list[Any],
) -> Any:
    """Start a gang attempt's supervisor on the driver's node; its reference resolves to the attempt's
    result as a wire tuple (`AttemptResult.from_wire`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return (
        _remote(supervise)
        .options(
            **ray_task_options(num_cpus=0, num_gpus=0, memory=None, custom={}, env={}),
            name=f"{name}:gang",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(payload, shared, plan, name, log_path, env, *after)
    )
