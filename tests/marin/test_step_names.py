"""Step names that a path or a command line would misread are refused when the Step is built (issue 32):
parts made only of dots (`.`, `..`, `...`) and parts starting with `-`; the message names the name, the part
and the fix."""

from __future__ import annotations

import pytest

from marin import Step, this_output_path
from marin.errors import StepDefinitionError
from tests.marin.fns import NoopConfig, noop


def _step(name: str) -> Step:
    return Step(name=name, fn=noop, config=NoopConfig(output_path=this_output_path()))


@pytest.mark.parametrize(
    ("name", "part"),
    [(".", "."), ("./x", "."), ("x/.", "."), ("..", ".."), ("a/../b", ".."), ("...", "..."),
     ("x/..../y", "....")],
    ids=["dot", "dot_first", "dot_last", "dotdot", "dotdot_middle", "three_dots", "four_dots"],
)
def test_all_dot_parts_are_refused(name: str, part: str) -> None:
    with pytest.raises(StepDefinitionError, match="only dots") as info:
        _step(name)
    message = str(info.value)
    assert f"invalid step name {name!r}" in message and f"the part {part!r}" in message
    assert "give every part a letter or digit" in message


@pytest.mark.parametrize(("name", "part"), [("-rf", "-rf"), ("x/-y", "-y"), ("--", "--"), ("a/-", "-")],
                         ids=["rf", "second_part", "double_dash", "lone_dash"])
def test_parts_starting_with_a_dash_are_refused(name: str, part: str) -> None:
    with pytest.raises(StepDefinitionError, match="starts with '-'") as info:
        _step(name)
    message = str(info.value)
    assert f"invalid step name {name!r}" in message and f"the part {part!r}" in message
    assert "start it with a letter, digit or '_'" in message


@pytest.mark.parametrize("name", ["x-rf", "_rf", "tokenize/v1.2", "a.b/c..d", ".hidden", "x/.cfg", "a-/b-"])
def test_dots_and_dashes_inside_parts_stay_allowed(name: str) -> None:
    assert _step(name).name == name
