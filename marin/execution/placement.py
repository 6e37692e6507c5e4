"""Where a gang step can go: the feasibility check for `Resources(hosts=N)` and
`Resources(tpu=..., slices=K)`,
without Ray (it reads the node list the backend passes in, as `resources.check_feasible` does).

A gang of N hosts needs N distinct alive nodes that each fit the per-host request (the launcher places it
with a STRICT_SPREAD placement group). A TPU slice needs, per slice, one node carrying the slice's
`TPU-<type>-head` resource (Ray gives it to worker 0 of each slice) and, in all, `hosts x slices` nodes with
the chips per host. The message names the step, what it asked for and what the cluster has, so a gang
that could never be placed fails before anything runs instead of waiting forever.
"""

from __future__ import annotations

from marin.definition.step import Resources
from marin.definition.tpu import slice_shape


def _fits(node: dict[str, float], want: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in want.items())


def _describe(want: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(want.items()))


def gang_problem(
    name: str, resources: Resources, want: dict[str, float], nodes: list[dict[str, float]]
) -> str | None:
    """None if the gang can be placed on `nodes`; otherwise a sentence naming the step, the request and what
    the cluster has. `want` is the per-host request in Ray's names (see resources.requested)."""
    fitting = sum(1 for n in nodes if _fits(n, want))
    if resources.tpu is None:
        if fitting >= resources.hosts:
            return None
        return (
            f"step {name} asks for hosts={resources.hosts} x {{{_describe(want)}}} on distinct nodes; the "
            f"cluster has {fitting} node(s) that fit, of {len(nodes)} alive"
        )
    shape = slice_shape(resources.tpu)
    heads = sum(int(n.get(shape.head_resource, 0.0)) for n in nodes)
    needed = shape.hosts * resources.slices
    if heads >= resources.slices and fitting >= needed:
        return None
    slices = f" x {resources.slices} slices" if resources.slices > 1 else ""
    return (
        f"step {name} asks for tpu={shape.name}{slices} ({shape.hosts} host(s) x {{{_describe(want)}}} per "
        f"slice); the cluster has {heads} {shape.head_resource} (one per slice of that type) and {fitting} "
        f"host(s) that fit, of {len(nodes)} alive"
    )
