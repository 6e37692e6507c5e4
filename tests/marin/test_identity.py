"""Identity: hashes change with every identity input and with nothing else; golden hashes; canonical JSON."""

from __future__ import annotations

import dataclasses
import enum
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin import Step, StepDefinitionError, output_path_of, prefix_path, this_output_path
from marin.graph import build_graph
from marin.jsonio import canonical_json
from tests.marin.fns import NoopConfig, SumConfig, WriteConfig, noop, sum_numbers, write_numbers


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 0.001
    layers: tuple[int, ...] = (2, 2)


@dataclasses.dataclass(frozen=True)
class AnyConfig:
    output_path: str
    value: object = None
    inner: Inner = Inner()


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def hashes(*steps: Step) -> dict[str, str]:
    return {n.name: n.hash for n in build_graph(steps).nodes}


def two_steps(n: int = 10, subpath: str = "numbers.txt", version: str | None = None) -> tuple[Step, Step]:
    numbers = Step(name="demo/numbers", fn=write_numbers,
                   config=WriteConfig(output_path=this_output_path(), n=n))
    total = Step(name="demo/total", fn=sum_numbers, version=version,
                 config=SumConfig(input_path=output_path_of(numbers, subpath),
                                  output_path=this_output_path()))
    return numbers, total


# Golden hashes: if one of these changes, every existing output path of every user changes. Only update them
# together with a HASH_SCHEME bump and a migration note in docs/concepts.md.
GOLDEN = {
    "demo/numbers": "26b8ffaabd019a5e1182f9f121218bac9cd16564a4d613c27213f9a49fb8e205",
    "demo/total": "f586a1a96ef8c7e7100fccfd9c0f2d2c51daedf9de6da7d4365c81c6875aada8",
    "ref/rich": "63c73f0c146206f6210833a2046ed7a0150232670191695fda0269c4ff3ea453",
    "ref/versioned": "fb0481548e00447f305146394e55a6d9b04e24999d385c76ed3c1965f9d2b710",
}


def reference_steps() -> list[Step]:
    numbers, total = two_steps()
    rich = Step(name="ref/rich", fn=noop, config=AnyConfig(
        output_path=this_output_path("out"),
        value={"a": [1, 2.5, "x", None, True], "color": Color.BLUE, "raw": prefix_path("raw/data")},
        inner=Inner(lr=3e-4, layers=(4, 8))))
    versioned = Step(name="ref/versioned", fn=noop, version="2", config=NoopConfig(
        output_path=this_output_path(), inputs=(output_path_of(numbers),), tag="t"))
    return [numbers, total, rich, versioned]


def test_golden_hashes() -> None:
    assert hashes(*reference_steps()) == GOLDEN


def test_golden_identity_document() -> None:
    graph = build_graph(two_steps())
    total = next(n for n in graph.nodes if n.name == "demo/total")
    dep = GOLDEN["demo/numbers"]
    assert canonical_json(total.identity) == (
        '{"config":{"input_path":{"$dep":"' + dep + '","subpath":"numbers.txt"},'
        '"output_path":{"$this":null}},'
        '"dependencies":["' + dep + '"],"name":"demo/total","version":null}'
    )


def test_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "x", None]}) == '{"a":[1.5,"x",null],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_same_hashes_under_two_prefixes_and_paths_follow_prefix() -> None:
    graph = build_graph(two_steps())
    for node in graph.nodes:
        assert node.output_path("/data/a") == f"/data/a/{node.name}-{node.hash[:8]}"
        assert node.output_path("gs://bucket/x") == f"gs://bucket/x/{node.name}-{node.hash[:8]}"
    assert hashes(*two_steps()) == {n.name: n.hash for n in graph.nodes}


def _total_hash(**step_kw: object) -> str:
    numbers, _ = two_steps()
    kw: dict[str, object] = {"name": "demo/total", "fn": sum_numbers,
                             "config": SumConfig(input_path=output_path_of(numbers, "numbers.txt"),
                                                 output_path=this_output_path())}
    kw.update(step_kw)
    return hashes(Step(**kw))[str(kw["name"])]  # type: ignore[arg-type]


BASE = GOLDEN["demo/total"]


@pytest.mark.parametrize(
    "change",
    [
        {"name": "demo/total2"},
        {"version": "2"},
        {"config": SumConfig(input_path="elsewhere", output_path=this_output_path())},
        {"config": SumConfig(input_path=output_path_of(two_steps()[0], "other.txt"),
                             output_path=this_output_path())},
        {"config": SumConfig(input_path=output_path_of(two_steps()[0], "numbers.txt"),
                             output_path=this_output_path("sub"))},
        {"config": SumConfig(input_path=output_path_of(two_steps(n=11)[0], "numbers.txt"),
                             output_path=this_output_path())},
    ],
    ids=["name", "version", "field", "subpath", "own-subpath", "dependency-config"],
)
def test_every_identity_input_changes_the_hash(change: dict[str, object]) -> None:
    assert _total_hash(**change) != BASE


@pytest.mark.parametrize(
    "change",
    [{"description": "other words"}, {"resources": {"num_cpus": 4, "resources": {"TPU": 8}}}, {"retries": 3},
     {"env": {"A": "b"}}],
    ids=["description", "resources", "retries", "env"],
)
def test_non_identity_inputs_do_not_change_the_hash(change: dict[str, object]) -> None:
    assert _total_hash(**change) == BASE


def test_runtime_field_is_not_hashed_but_reaches_the_function() -> None:
    a = Step(name="demo/numbers", fn=write_numbers,
             config=WriteConfig(output_path=this_output_path(), workers=1))
    b = Step(name="demo/numbers", fn=write_numbers,
             config=WriteConfig(output_path=this_output_path(), workers=8))
    assert hashes(a) == hashes(b) == {"demo/numbers": GOLDEN["demo/numbers"]}


def test_dependency_change_propagates_transitively() -> None:
    def chain(n: int) -> dict[str, str]:
        numbers, total = two_steps(n=n)
        last = Step(name="demo/last", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                                   inputs=(output_path_of(total),)))
        return hashes(last)

    a, b = chain(10), chain(12)
    assert all(a[k] != b[k] for k in a)


json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                  allow_infinity=False) | st.text()
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(value=json_value)
def test_hash_is_deterministic_and_insensitive_to_dict_order(value: object) -> None:
    def rebuilt(v: object) -> object:
        if isinstance(v, dict):
            return {k: rebuilt(v[k]) for k in reversed(list(v))}
        if isinstance(v, list):
            return [rebuilt(x) for x in v]
        return v

    a = Step(name="p/x", fn=noop, config=AnyConfig(output_path=this_output_path(), value=value))
    b = Step(name="p/x", fn=noop, config=AnyConfig(output_path=this_output_path(), value=rebuilt(value)))
    assert hashes(a) == hashes(b)


@settings(max_examples=150, deadline=None)
@given(a=json_value, b=json_value)
def test_different_values_give_different_hashes(a: object, b: object) -> None:
    same = canonical_json(a) == canonical_json(b)
    ha = hashes(Step(name="p/x", fn=noop, config=AnyConfig(output_path=this_output_path(), value=a)))
    hb = hashes(Step(name="p/x", fn=noop, config=AnyConfig(output_path=this_output_path(), value=b)))
    assert (ha == hb) == same


@settings(max_examples=100, deadline=None)
@given(lr=st.floats(allow_nan=False, allow_infinity=False), layers=st.lists(st.integers(0, 64), max_size=4),
       prefix_a=st.sampled_from(["/tmp/a", "gs://b/c", "s3://d/e/f"]), prefix_b=st.sampled_from(["/x", "gs://y"]))
def test_prefix_never_enters_identity(lr: float, layers: list[int], prefix_a: str, prefix_b: str) -> None:
    step = Step(name="p/y", fn=noop, config=AnyConfig(output_path=this_output_path(),
                                                      inner=Inner(lr=lr, layers=tuple(layers))))
    node = build_graph([step]).nodes[0]
    assert node.output_path(prefix_a).rsplit("/", 1)[1] == node.output_path(prefix_b).rsplit("/", 1)[1]


class Opaque:
    pass


def _helper() -> None:
    pass


@pytest.mark.parametrize(
    ("value", "field", "why"),
    [
        (_helper, "config.value", "functions"),
        (Opaque(), "config.value", "not a dataclass"),
        ({1: "a"}, "config.value", "not a str"),
        ({"k": [1.0, math.nan]}, "config.value.k[1]", "NaN"),
        (math.inf, "config.value", "NaN and infinities"),
        ({"s": {1, 2}}, "config.value.s", "not a dataclass"),
    ],
    ids=["function", "default-repr-object", "int-dict-key", "nested-nan", "infinity", "set"],
)
def test_unserializable_values_are_refused_with_step_and_field(value: object, field: str, why: str) -> None:
    step = Step(name="bad/value", fn=noop, config=AnyConfig(output_path=this_output_path(), value=value))
    with pytest.raises(StepDefinitionError) as info:
        build_graph([step])
    assert "step bad/value" in str(info.value) and f"field {field} " in str(info.value)
    assert why in str(info.value)


def _make_closure() -> object:
    def inner(cfg: object) -> None:
        pass

    return inner


@pytest.mark.parametrize("fn", [lambda cfg: None, _make_closure()], ids=["lambda", "closure"])
def test_lambdas_and_closures_are_definition_errors(fn: object) -> None:
    with pytest.raises(StepDefinitionError, match="lambda or a closure"):
        Step(name="bad/fn", fn=fn, config=WriteConfig(output_path=this_output_path()))  # type: ignore[arg-type]


@dataclasses.dataclass
class Mutable:
    output_path: str


def test_config_must_be_a_frozen_dataclass() -> None:
    with pytest.raises(StepDefinitionError, match="must be frozen"):
        Step(name="bad/cfg", fn=noop, config=Mutable(output_path="x"))
    with pytest.raises(StepDefinitionError, match="frozen dataclass instance"):
        Step(name="bad/cfg", fn=noop, config={"output_path": "x"})


@pytest.mark.parametrize("name", ["", "/abs", "a//b", "a/../b", "has space", "x/.marin"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(StepDefinitionError):
        Step(name=name, fn=noop, config=NoopConfig(output_path=this_output_path()))


def test_two_different_steps_with_one_name_is_an_error() -> None:
    a = Step(name="dup/x", fn=noop, config=NoopConfig(output_path=this_output_path(), tag="a"))
    b = Step(name="dup/x", fn=noop, config=NoopConfig(output_path=this_output_path(), tag="b"))
    with pytest.raises(StepDefinitionError,
                       match=r"two different steps are named 'dup/x'.*config.tag: 'a' -> 'b'"):
        build_graph([a, b])


def test_identical_steps_are_merged() -> None:
    n1, t1 = two_steps()
    n2, t2 = two_steps()
    graph = build_graph([t1, t2, n2])
    assert [n.name for n in graph.nodes] == ["demo/numbers", "demo/total"]
    assert graph.node_of(n1) is graph.node_of(n2)


def test_dependencies_are_discovered_transitively() -> None:
    _, total = two_steps()
    last = Step(name="demo/last", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                               inputs=(output_path_of(total, "total.txt"),)))
    assert [n.name for n in build_graph([last]).nodes] == ["demo/numbers", "demo/total", "demo/last"]


def test_pinned_path_is_used_warned_and_shields_dependents() -> None:
    def build(n: int) -> tuple[dict[str, str], list[str], str]:
        numbers, total = two_steps(n=n)
        pinned = total.with_output_path("demo/total-pinned00")
        user = Step(name="demo/user", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                                   inputs=(output_path_of(pinned),)))
        graph = build_graph([user])
        path = graph.node_of(pinned).output_path("/p")
        return {n.name: n.hash for n in graph.nodes}, graph.warnings, path

    h10, warnings, path = build(10)
    h12, _, _ = build(12)
    assert path == "/p/demo/total-pinned00"
    assert any("pinned output path demo/total-pinned00 differs" in w for w in warnings)
    assert h10["demo/numbers"] != h12["demo/numbers"]
    assert h10["demo/total"] == h12["demo/total"] and h10["demo/user"] == h12["demo/user"]


def test_ten_thousand_step_chain_has_no_recursion_limit() -> None:
    prev = Step(name="chain/s0", fn=noop, config=NoopConfig(output_path=this_output_path()))
    for i in range(1, 10_000):
        prev = Step(name=f"chain/s{i}", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                                  inputs=(output_path_of(prev),)))
    graph = build_graph([prev])
    assert len(graph.nodes) == 10_000 and graph.nodes[-1].name == "chain/s9999"
    assert "chain/s9999" in repr(prev)


def test_placeholders_resolve_to_real_paths_inside_nested_values() -> None:
    from marin.definition.identity import resolve

    numbers, _ = two_steps()
    config = AnyConfig(output_path=this_output_path("out"),
                       value={"raw": prefix_path("raw/data"),
                              "inputs": (output_path_of(numbers, "numbers.txt"),
                                                                         numbers), "n": 3},
                       inner=Inner(lr=0.5))
    resolved = resolve(config, own_path="gs://b/p/x-1", prefix="gs://b/p", dep_path=lambda s: f"gs://b/p/{s.name}-h")
    assert resolved == AnyConfig(output_path="gs://b/p/x-1/out",
                                 value={"raw": "gs://b/p/raw/data",
                                        "inputs": ("gs://b/p/demo/numbers-h/numbers.txt", "gs://b/p/demo/numbers-h"),
                                        "n": 3},
                                 inner=Inner(lr=0.5))
    assert resolved.inner is config.inner  # untouched values are shared, not copied
