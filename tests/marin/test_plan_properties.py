"""Property tests of planning and execution on random DAGs: failures propagate exactly to descendants,
everything else succeeds, and the next plan says skip / failed / blocked accordingly (and runs everything with
--force-run-failed once the failures are gone)."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from tests.marin.fns import FailConfig, NoopConfig, fail, noop


@st.composite
def dags(draw: st.DrawFn) -> tuple[int, list[list[int]], set[int]]:
    n = draw(st.integers(2, 7))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    failing = draw(st.sets(st.integers(0, n - 1), max_size=2))
    return n, deps, failing


def build(n: int, deps: list[list[int]], failing: set[int]) -> list[Step]:
    steps: list[Step] = []
    for i in range(n):
        inputs = tuple(output_path_of(steps[d]) for d in deps[i])
        if i in failing:
            steps.append(Step(name=f"p/s{i}", fn=fail,
                              config=FailConfig(output_path=this_output_path(), inputs=inputs)))
        else:
            steps.append(Step(name=f"p/s{i}", fn=noop,
                              config=NoopConfig(output_path=this_output_path(), inputs=inputs)))
    return steps


def ancestors(i: int, deps: list[list[int]]) -> set[int]:
    out: set[int] = set()
    stack = list(deps[i])
    while stack:
        d = stack.pop()
        if d not in out:
            out.add(d)
            stack.extend(deps[d])
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag=dags())
def test_failures_propagate_to_descendants_only(dag: tuple[int, list[list[int]], set[int]]) -> None:
    n, deps, failing = dag
    steps = build(n, deps, failing)
    prefix = tempfile.mkdtemp(prefix="marin-prop-")
    result = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="prop.py")
    expected = {}
    for i in range(n):
        failed_above = ancestors(i, deps) & failing
        if failed_above:
            expected[f"p/s{i}"] = "DEP_FAILED"
        elif i in failing:
            expected[f"p/s{i}"] = "FAILED"
        else:
            expected[f"p/s{i}"] = "SUCCESS"
    assert {f"p/s{i}": result.status_of(f"p/s{i}") for i in range(n)} == expected
    assert result.status == ("FAILED" if failing else "SUCCESS")

    plan = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local", dry_run=True),
                          verbose=False, script="prop.py").plan
    actions = {e.name: e.action for e in plan.entries}
    for name, status in expected.items():
        want = {"SUCCESS": "skip", "FAILED": "failed", "DEP_FAILED": "blocked"}[status]
        assert actions[name] == want, (name, status, actions)

    fixed = build(n, deps, set())  # same names, different configs for the failing ones: new hashes
    healed = run_experiment(fixed, ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="prop.py")
    assert healed.status == "SUCCESS"
    for e in healed.plan.entries:
        i = int(e.name.rsplit("s", 1)[1])
        touched = i in failing or bool(ancestors(i, deps) & failing)
        assert e.action == ("run" if touched else "skip"), (e.name, e.action)
        if touched:  # its earlier run under another hash is found and the difference explained
            assert e.changed and e.previous_hash and e.previous_hash != e.hash, (e.name, e.changed)
