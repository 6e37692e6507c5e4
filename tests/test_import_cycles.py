"""No import cycles in the house (issue 26): the module-level import graph of every package in ``PACKAGES``
(built by grimp, the library under import-linter) has no strongly connected component of more than one
module. Every import counts: those under ``if TYPE_CHECKING:`` and those inside functions too, since a cycle
hidden behind either is still two modules that cannot be understood, tested or moved apart.

The graph holds all the packages at once, so a cycle across two packages is found too; each package's test
fails on the cycles that pass through one of its modules and prints each with its import lines.

``moe_trainer`` is in the list like the others: the trainer's former cycles (``moe_trainer.train`` with
``compiled``, ``batch_source``, ``presets`` and ``resume`` through TYPE_CHECKING imports; ``dispatch`` with
``dispatch_ep``) were removed, and its case passes like every other package's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

PACKAGES = ("marin", "operators", "openlab_records", "experiments", "moe_trainer")


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep import chains): the strongly connected
    components of ``graph`` (node -> the nodes it points to), each sorted, in the order Tarjan completes
    them. Nodes only pointed to are nodes too."""
    nodes = sorted(set(graph) | {m for targets in graph.values() for m in targets})
    edges = {n: sorted(graph.get(n, ())) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]  # (node, the position of the next of its edges to follow)
        while work:
            node, i = work[-1]
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work[-1] = (node, i + 1)
                target = edges[node][i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def import_graph(packages: Iterable[str]) -> grimp.ImportGraph:
    """grimp's graph of ``packages`` (importable from sys.path), TYPE_CHECKING imports included, no cache."""
    first, *rest = packages
    return grimp.build_graph(first, *rest, exclude_type_checking_imports=False, cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module."""
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    return [c for c in strongly_connected_components(edges) if len(c) > 1]


def describe_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """The modules of one cycle and every import between them, with its line."""
    members = set(component)
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                where, text = f"{importer}:{detail['line_number']}", detail["line_contents"].strip()
                lines.append(f"  {where} imports {imported}: {text}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def house_graph() -> grimp.ImportGraph:
    return import_graph(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(house_graph: grimp.ImportGraph, package: str) -> None:
    assert package in house_graph.modules, f"{package} is in PACKAGES but grimp did not find it on sys.path"
    mine = [
        c for c in import_cycles(house_graph) if any(m == package or m.startswith(f"{package}.") for m in c)
    ]
    report = "\n\n".join(describe_cycle(house_graph, c) for c in mine)
    assert not mine, f"import cycles through {package} (break each: move the shared part down):\n{report}"


def test_tarjan_finds_each_component_once() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": ["a"]}
    components = strongly_connected_components(graph)
    assert sorted(components) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert strongly_connected_components({"x": ["x"]}) == [["x"]]
    chain = {f"m{i}": [f"m{i + 1}"] for i in range(5000)}  # deeper than the recursion limit
    chain["m5000"] = ["m0"]
    assert [len(c) for c in strongly_connected_components(chain)] == [5001]


def test_the_detector_finds_a_cycle_in_a_throwaway_package(tmp_path: Path) -> None:
    name = "cycle_fixture_pkg"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(f"from {name} import b\n\nVALUE = 1\n")
    (pkg / "b.py").write_text(
        "from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\n"
        f"if TYPE_CHECKING:\n    from {name}.a import VALUE\n"
    )
    (pkg / "c.py").write_text(f"import {name}.a\n")  # imports into the cycle, is not part of it
    sys.path.insert(0, str(tmp_path))
    try:
        graph = import_graph([name])
        cycles = import_cycles(graph)
        assert cycles == [[f"{name}.a", f"{name}.b"]]
        text = describe_cycle(graph, cycles[0])
        assert f"{name}.a:1 imports {name}.b: from {name} import b" in text
        assert f"{name}.b:6 imports {name}.a: from {name}.a import VALUE" in text
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
