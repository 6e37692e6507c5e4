"""A step's phases change only along the table in execution/state.py, and the retry policy's budget."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from marin import Step, this_output_path
from marin.errors import InternalError
from marin.execution.attempt import Outcome
from marin.execution.retry import RetryPolicy
from marin.execution.state import IN_FLIGHT, TRANSITIONS, Board, Phase, StepState
from marin.graph.dag import build_graph
from marin.graph.plan import make_plan
from marin.storage.fs import storage_for
from tests.marin.fns import WriteConfig, write_numbers

FINAL = (Phase.SUCCESS, Phase.FAILED, Phase.PREEMPTED, Phase.DEP_FAILED)


def _board(tmp_path: Path) -> tuple[Board, str]:
    step = Step(name="s/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path()))
    prefix = str(tmp_path / "out")
    plan = make_plan(build_graph([step]), prefix, storage_for(prefix))
    (entry,) = plan.entries
    assert entry.node is not None
    board = Board()
    board.add(entry.hash, StepState(entry, entry.node))
    return board, entry.hash


def test_every_phase_has_a_row_and_final_phases_lead_nowhere() -> None:
    assert set(TRANSITIONS) == set(Phase)
    for phase in FINAL:
        assert TRANSITIONS[phase] == frozenset()
    for phase in (Phase.PENDING, Phase.QUEUED, Phase.RUNNING, Phase.WAITING):
        assert TRANSITIONS[phase], phase


def test_moves_keep_the_running_and_waiting_sets_in_step(tmp_path: Path) -> None:
    board, key = _board(tmp_path)
    st = board[key]
    assert (st.phase, st.status, board.running, board.waiting) == (Phase.PENDING, None, set(), set())
    board.move(key, Phase.QUEUED)
    assert (st.status, st.queued, board.running, board.waiting) == ("RUNNING", True, {key}, set())
    board.move(key, Phase.WAITING)
    assert (st.status, board.running, board.waiting) == ("WAITING", set(), {key})
    board.move(key, Phase.RUNNING)
    assert (st.status, st.queued, board.running, board.waiting) == ("RUNNING", False, {key}, set())
    board.move(key, Phase.SUCCESS)
    assert (st.status, board.running, board.waiting) == ("SUCCESS", set(), set())


@pytest.mark.parametrize("start", list(Phase), ids=lambda p: p.name)
def test_an_illegal_change_is_an_internal_error_and_changes_nothing(tmp_path: Path, start: Phase) -> None:
    board, key = _board(tmp_path)
    st = board[key]
    st.phase = start  # the phase a step can reach; set directly to test every row
    for to in sorted(set(Phase) - TRANSITIONS[start], key=lambda p: p.name):
        illegal = rf"s/numbers .*illegal state change {start.name} -> {to.name}"
        with pytest.raises(InternalError, match=illegal):
            board.move(key, to)
        assert st.phase is start and (key in board.running) is False
    for to in TRANSITIONS[start]:
        st.phase = start
        board.move(key, to)
        assert st.phase is to and (key in board.running) == (to in IN_FLIGHT)


def test_a_final_step_cannot_run_again(tmp_path: Path) -> None:
    board, key = _board(tmp_path)
    board.move(key, Phase.RUNNING)
    board.move(key, Phase.SUCCESS)
    with pytest.raises(InternalError, match="allowed from SUCCESS: none"):
        board.move(key, Phase.RUNNING)


def test_failures_and_preemptions_have_a_budget_each() -> None:
    """Issue 13 replaced the single budget: `retries` counts FAILED attempts, `max_preemptions` PREEMPTED."""
    assert not RetryPolicy(failures=0, preemptions=5).retry(Counter({Outcome.FAILED: 1}))
    assert RetryPolicy(failures=1, preemptions=0).retry(Counter({Outcome.FAILED: 1}))
    assert not RetryPolicy(failures=1, preemptions=0).retry(Counter({Outcome.FAILED: 2}))
    assert not RetryPolicy(failures=5, preemptions=0).retry(Counter({Outcome.PREEMPTED: 1}))
    assert RetryPolicy(failures=0, preemptions=2).retry(Counter({Outcome.PREEMPTED: 2}))
    # preemptions do not use up the failure budget, nor the reverse
    assert RetryPolicy(failures=1, preemptions=3).retry(Counter({Outcome.FAILED: 1, Outcome.PREEMPTED: 3}))
    policy = RetryPolicy(failures=0, preemptions=1)
    assert "preemption budget exhausted (max_preemptions=1): interrupted 2 times" in policy.exhausted(
        Counter({Outcome.PREEMPTED: 2}))
    assert policy.exhausted(Counter({Outcome.FAILED: 1})) == ""
    waits = [RetryPolicy.backoff_s(Counter({Outcome.PREEMPTED: n}), Outcome.PREEMPTED) for n in (1, 2, 3, 9)]
    assert waits == [1.0, 2.0, 4.0, 30.0]
    assert RetryPolicy.backoff_s(Counter({Outcome.FAILED: 1}), Outcome.FAILED) == 0.0
