"""Gang requests without Ray: `Resources(hosts=..., tpu=..., slices=...)` validation, the TPU slice table,
the feasibility messages, and the classification of an attempt's end from node liveness."""

from __future__ import annotations

import pytest

from marin import InfeasibleResourcesError, Resources, Step, this_output_path
from marin.definition.tpu import SLICES, slice_shape
from marin.errors import StepDefinitionError
from marin.execution import causes
from marin.execution.causes import NodeState
from marin.execution.gang import GangPlan, Member, coordinator_port, member_env, rank_log_path
from marin.execution.resources import check_feasible, requested
from tests.marin.fns import NoopConfig, noop


@pytest.mark.parametrize(
    ("name", "hosts", "chips_per_host", "topology"),
    [
        ("v4-8", 1, 4, "2x2x1"),
        ("v4-32", 4, 4, "2x2x4"),
        ("v5p-64", 8, 4, "2x4x4"),
        ("v5p-128", 16, 4, "4x4x4"),
        ("v5litepod-8", 1, 8, "2x4"),
        ("v5litepod-16", 4, 4, "4x4"),
        ("v6e-256", 64, 4, "16x16"),
    ],
)
def test_the_slice_table_has_the_public_shapes(
    name: str, hosts: int, chips_per_host: int, topology: str
) -> None:
    shape = slice_shape(name)
    assert (shape.hosts, shape.chips_per_host, shape.topology) == (hosts, chips_per_host, topology)
    assert shape.head_resource == f"TPU-{name}-head"


def test_every_multi_host_slice_has_four_chips_per_host_and_its_topology_holds_its_chips() -> None:
    for shape in SLICES.values():
        dims = [int(d) for d in shape.topology.split("x")]
        product = 1
        for d in dims:
            product *= d
        assert product == shape.chips, shape
        assert shape.hosts == 1 or shape.chips_per_host == 4, shape


def test_gang_resources_are_checked_when_built() -> None:
    assert Resources(hosts=4).gang_size == 4 and Resources(hosts=4).is_gang
    assert Resources(tpu="v5p-64").gang_size == 8 and Resources(tpu="v5p-64", slices=2).gang_size == 16
    assert not Resources(tpu="v4-8").is_gang  # one host: an ordinary task with the slice's chips
    assert requested(Resources(num_cpus=8, tpu="v5p-64")) == {"CPU": 8.0, "TPU": 4.0}
    assert Resources(tpu="v5p-64", slices=2).to_json() == {"num_cpus": 1.0, "tpu": "v5p-64", "slices": 2}
    with pytest.raises(
        StepDefinitionError, match=r"unknown TPU slice type 'v5p-65'; valid v5p slices: v5p-8,"
    ):
        Resources(tpu="v5p-65")
    with pytest.raises(StepDefinitionError, match="valid generations: v4-"):
        Resources(tpu="tpu-big")
    with pytest.raises(StepDefinitionError, match=r"takes its host count from the slice \(8\); drop hosts=2"):
        Resources(tpu="v5p-64", hosts=2)
    with pytest.raises(StepDefinitionError, match=r"slices=2 needs a TPU slice type"):
        Resources(hosts=2, slices=2)
    with pytest.raises(StepDefinitionError, match=r"already asks for 4 TPU chips per host"):
        Resources(tpu="v4-16", resources={"TPU": 4})
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StepDefinitionError, match="Resources.hosts must be an int >= 1"):
            Resources(hosts=bad)  # type: ignore[arg-type]
    with pytest.raises(StepDefinitionError, match="step g/bad: Resources.hosts"):
        Step(name="g/bad", fn=noop, config=NoopConfig(this_output_path()), resources={"hosts": 0})


NODES = [
    {"CPU": 8.0, "GPU": 8.0},
    {"CPU": 8.0, "GPU": 8.0},
    {"CPU": 4.0},
    {"CPU": 100.0, "TPU": 4.0, "TPU-v4-16-head": 1.0, "slice-a": 1.0},
    {"CPU": 100.0, "TPU": 4.0, "slice-a": 1.0},
]


def test_a_gang_fits_only_on_enough_distinct_nodes_and_the_error_says_what_the_cluster_has() -> None:
    check_feasible(
        [
            ("train/gpu2", Resources(num_cpus=8, num_gpus=8, hosts=2)),
            ("train/tpu", Resources(num_cpus=8, tpu="v4-16")),
        ],
        NODES,
        "add nodes",
    )
    with pytest.raises(InfeasibleResourcesError) as info:
        check_feasible(
            [
                ("train/gpu4", Resources(num_cpus=8, num_gpus=8, hosts=4)),
                ("train/v5p", Resources(tpu="v5p-64")),
                ("train/two-slices", Resources(tpu="v4-16", slices=2)),
            ],
            NODES,
            "add nodes",
        )
    text = str(info.value)
    assert (
        "step train/gpu4 asks for hosts=4 x {CPU=8, GPU=8} on distinct nodes; the cluster has 2 node(s) that "
        "fit, of 5 alive"
    ) in text
    assert (
        "step train/v5p asks for tpu=v5p-64 (8 host(s) x {CPU=1, TPU=4} per slice); the cluster has 0 "
        "TPU-v5p-64-head" in text
    )
    assert "step train/two-slices asks for tpu=v4-16 x 2 slices" in text and "has 1 TPU-v4-16-head" in text
    assert text.endswith("Fix: add nodes")


def test_a_gang_on_the_local_backend_is_refused_before_anything_runs(run_marin) -> None:  # type: ignore[no-untyped-def]
    step = Step(name="g/local", fn=noop, config=NoopConfig(this_output_path()), resources=Resources(hosts=2))
    with pytest.raises(
        InfeasibleResourcesError, match=r"step g/local asks for hosts=2 .* the cluster has 1 node"
    ):
        run_marin([step])


def test_members_get_their_rank_the_coordinator_and_for_multislice_the_megascale_variables() -> None:
    env = member_env(Member(rank=5, bundle=1, node_id="n", ip="10.0.0.5", slice_id=1), 8, "10.0.0.1:1234", 2)
    assert env == {
        "MARIN_GANG_SIZE": "8",
        "MARIN_GANG_RANK": "5",
        "MARIN_COORDINATOR": "10.0.0.1:1234",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1",
        "MEGASCALE_PORT": "8081",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert "MEGASCALE_PORT" not in member_env(Member(0, 0, "n", "ip"), 2, "ip:1", 1)
    assert GangPlan.of(Resources(tpu="v4-16", slices=2)).hosts_per_slice == 2
    assert rank_log_path("/p/.marin/logs/attempt-3.log", 0) == "/p/.marin/logs/attempt-3.log"
    assert rank_log_path("/p/.marin/logs/attempt-3.log", 2) == "/p/.marin/logs/attempt-3.rank-2.log"


class _DictKV:
    """The three calls `coordinator_port` makes of Ray's internal key-value store, over a dict."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.data[key] = value

    def get(self, key: str) -> str | None:
        return self.data.get(key)


def test_rank_0_publishes_a_free_port_the_others_read_and_a_missing_one_times_out_clearly() -> None:
    import socket

    kv = _DictKV()
    with pytest.raises(TimeoutError, match="rank 0 did not publish its coordinator port within 0 s"):
        coordinator_port(kv, "g:1", 1, timeout_s=0.05)
    port = coordinator_port(kv, "g:1", 0, timeout_s=1)
    assert kv.data == {"g:1": str(port)} and coordinator_port(kv, "g:1", 3, timeout_s=1) == port
    with socket.socket() as s:
        s.bind(("", port))  # rank 0's port is free on its host


ALIVE = {"a": NodeState("a", "10.0.0.1", True), "b": NodeState("b", "10.0.0.2", True)}
DEAD = {**ALIVE, "b": NodeState("b", "10.0.0.2", False, "UNEXPECTED_TERMINATION")}
DRAINED = {**ALIVE, "b": NodeState("b", "10.0.0.2", False, "AUTOSCALER_DRAIN_PREEMPTED")}


@pytest.mark.parametrize(
    ("outcomes", "nodes", "cause"),
    [
        (["app", "cancelled"], ALIVE, causes.FAILED),
        (["app", "crash"], ALIVE, causes.FAILED),  # a survivor aborted after the member that raised
        (
            ["app", "node"],
            DEAD,
            causes.NODE_DIED,
        ),  # the survivor's collective error came first: liveness wins
        (["app", "cancelled"], DEAD, causes.NODE_DIED),
        (["crash", "node"], DRAINED, causes.PREEMPTED),
        (["cancelled", "node"], ALIVE, causes.NODE_DIED),  # the member's node is not yet reported dead
        (["oom", "cancelled"], ALIVE, causes.OOM),
        (["crash", "cancelled"], ALIVE, causes.PREEMPTED),  # a worker killed by the system on a live node
        (
            ["cancelled", "node"],
            {**DEAD, "b": NodeState("b", "10.0.0.2", False, "UNEXPECTED_TERMINATION", drained=True)},
            causes.PREEMPTED,
        ),  # seen draining, then killed before its deadline: Ray says "unexpected"
    ],
    ids=[
        "raised",
        "raised-then-survivor-crashed",
        "collective-error-first",
        "dead-node",
        "drained",
        "node-error-before-death-report",
        "oom",
        "killed-worker",
        "seen-draining",
    ],
)
def test_an_end_is_classified_from_node_liveness_first(
    outcomes: list[str], nodes: dict[str, NodeState], cause: str
) -> None:
    assert causes.classify([causes.MemberEnd(o) for o in outcomes], nodes) == cause


def test_node_states_read_rays_node_table() -> None:
    table = [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "DeathReason": 0},
        {
            "NodeID": "b",
            "Alive": False,
            "NodeManagerAddress": "10.0.0.2",
            "DeathReason": 3,
            "DeathReasonMessage": "preempted",
        },
    ]
    states = causes.node_states(table, ["a", "b", "c"])
    assert states["a"].alive and not states["b"].alive and states["b"].preempted
    assert not states["c"].alive  # no longer listed
