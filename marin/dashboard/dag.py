"""A layered left-to-right layout of an experiment's step DAG, computed in Python and drawn as SVG.

Layer = length of the longest dependency chain leading to the step (sources in layer 0), so every edge points
right. Inside a layer, steps are ordered by a few barycenter sweeps (the mean position of their neighbours in
the adjacent layer), the classic Sugiyama heuristic that removes most crossings on experiment-sized graphs.
Iterative throughout: a 10,000-step chain lays out without recursion. Cycles (a corrupt manifest) cannot come
from the executor; their nodes are put in a last layer instead of failing the page.
"""

from __future__ import annotations

from collections import defaultdict, deque

from marin.dashboard.schemas import Dag, DagEdge, DagNode, StepRef

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 190.0, 34.0, 60.0, 14.0, 10.0


def layout(steps: list[StepRef]) -> Dag:
    by_hash = {s.hash: s for s in steps}
    parents = {
        s.hash: [d for d in dict.fromkeys(s.dependencies) if d in by_hash and d != s.hash] for s in steps
    }
    children: dict[str, list[str]] = defaultdict(list)
    for h, ps in parents.items():
        for p in ps:
            children[p].append(h)
    layer = _layers(list(by_hash), parents, children)
    layers: dict[int, list[str]] = defaultdict(list)
    for h in sorted(by_hash, key=lambda h: (by_hash[h].name, h)):
        layers[layer[h]].append(h)
    order = _order(layers, parents, children)

    tallest = max((len(v) for v in layers.values()), default=0)
    height = PAD * 2 + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    pos: dict[str, tuple[float, float]] = {}
    for li, members in layers.items():
        span = len(members) * NODE_H + (len(members) - 1) * GAP_Y
        top = (height - span) / 2
        for i, h in enumerate(sorted(members, key=order.__getitem__)):
            pos[h] = (PAD + li * (NODE_W + GAP_X), top + i * (NODE_H + GAP_Y))
    nodes = [
        DagNode(hash=h, name=s.name, path=s.path, status=s.status, layer=layer[h], x=pos[h][0], y=pos[h][1])
        for h, s in by_hash.items()
    ]
    edges = []
    for h, ps in parents.items():
        for p in ps:
            (x1, y1), (x2, y2) = pos[p], pos[h]
            x1, y1, y2 = x1 + NODE_W, y1 + NODE_H / 2, y2 + NODE_H / 2
            mid = (x1 + x2) / 2
            edges.append(
                DagEdge(
                    source=p,
                    target=h,
                    d=f"M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}",
                )
            )
    width = PAD * 2 + (max(layers, default=-1) + 1) * (NODE_W + GAP_X) - (GAP_X if layers else 0)
    return Dag(width=width, height=height, node_width=NODE_W, node_height=NODE_H, nodes=nodes, edges=edges)


def _layers(
    hashes: list[str], parents: dict[str, list[str]], children: dict[str, list[str]]
) -> dict[str, int]:
    indegree = {h: len(parents[h]) for h in hashes}
    queue = deque(h for h in hashes if indegree[h] == 0)
    layer = dict.fromkeys(queue, 0)
    while queue:
        h = queue.popleft()
        for c in children[h]:
            layer[c] = max(layer.get(c, 0), layer[h] + 1)
            indegree[c] -= 1
            if indegree[c] == 0:
                queue.append(c)
    last = max(layer.values(), default=-1) + 1
    for h in hashes:  # left in a cycle
        layer.setdefault(h, last)
    return layer


def _order(
    layers: dict[int, list[str]], parents: dict[str, list[str]], children: dict[str, list[str]]
) -> dict[str, float]:
    order = {h: float(i) for members in layers.values() for i, h in enumerate(members)}
    ids = sorted(layers)
    for sweep in range(4):
        down = sweep % 2 == 0
        for li in ids[1:] if down else ids[-2::-1]:
            members = layers[li]

            def key(h: str, down: bool = down) -> tuple[float, float]:
                nbrs = parents[h] if down else children[h]
                return (sum(order[n] for n in nbrs) / len(nbrs) if nbrs else order[h], order[h])

            for i, h in enumerate(sorted(members, key=key)):
                order[h] = float(i)
            layers[li] = sorted(members, key=order.__getitem__)
    return order
