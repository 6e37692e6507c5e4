"""The dashboard server's collector policy (marin/dashboard/collector.py): survivors of a full collection are
frozen, so the next full collection walks only what is new; a cycle made garbage later is still collected;
after `full_every_s` the policy unfreezes everything."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from marin.dashboard.collector import FreezeAfterFullCollection, install


@pytest.fixture()
def policy() -> Iterator[FreezeAfterFullCollection]:
    installed = install()
    try:
        yield installed
    finally:
        gc.callbacks.remove(installed)
        gc.unfreeze()


class Node:
    other: Node | None = None


def test_survivors_of_a_full_collection_are_frozen_and_new_cycles_still_collected(
        policy: FreezeAfterFullCollection) -> None:
    assert install() is policy  # installed once
    kept = [{"row": [i]} for i in range(10_000)]
    gc.collect()
    assert policy.freezes >= 1 and gc.get_freeze_count() >= len(kept)
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None  # made after the freeze: walked and freed


def test_the_policy_unfreezes_everything_once_per_period(policy: FreezeAfterFullCollection) -> None:
    gc.collect()
    assert gc.get_freeze_count() > 0
    policy.full_every_s = 0.0
    gc.collect()
    assert gc.get_freeze_count() == 0  # the next full collection walks the whole heap again
