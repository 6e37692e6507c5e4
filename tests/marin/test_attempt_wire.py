"""The local backend's workers send `AttemptResult.to_wire()` through their pipe: a tuple of plain values that
pickles without looking up a class, and that `from_wire` turns back into the equal result, for every outcome
and every field."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from marin.execution.attempt import HOST, AttemptResult, Outcome


def _every_field_set(outcome: Outcome) -> AttemptResult:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        failed = AttemptResult.from_exception(exc, outcome=outcome, context="cannot run")
    return dataclasses.replace(failed, started=1.5, ended=2.5, log_path="/p/.marin/logs/attempt-2.log",
                               host=HOST, lease_released=True, cause="node_lost", hosts=("h1", "h2"))


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.name)
def test_a_result_survives_the_wire_with_every_field(outcome: Outcome) -> None:
    for result in (AttemptResult(outcome), _every_field_set(outcome)):
        wire = result.to_wire()
        assert all(isinstance(v, str | float | int | bytes | tuple | type(None)) for v in wire)
        back = AttemptResult.from_wire(pickle.loads(pickle.dumps(wire)))
        assert back == result and back.outcome is outcome and hash(back) == hash(result)
        assert back.ok == (outcome is Outcome.SUCCESS) and back.error == result.error
        if result.exception is not None:
            assert back.exception is not None and type(pickle.loads(back.exception)) is ValueError
        with pytest.raises(dataclasses.FrozenInstanceError):
            back.message = "changed"  # type: ignore[misc]


def test_the_wire_pickles_no_class() -> None:
    payload = pickle.dumps(AttemptResult(Outcome.SUCCESS, started=1.0, ended=2.0, host=HOST).to_wire())
    assert b"AttemptResult" not in payload and b"Outcome" not in payload
