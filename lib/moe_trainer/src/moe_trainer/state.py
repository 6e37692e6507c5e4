"""The train state: one frozen pytree dataclass, ``TrainState``, threaded through the jitted step.

Every leaf is a JAX array (0-d for the counters). It is a pytree (``jax.tree_util.register_dataclass``), so
``jax.jit``, shardings and ``jax.tree.map`` see its leaves; a new state is made with ``dataclasses.replace``.

On disk a checkpoint holds the same leaves as a plain mapping ``{"step", "params", "opt_state", "health",
"rng", "data_position"}`` (``as_tree`` / ``from_tree``): that is the layout orbax wrote before this class
existed, so every checkpoint written since still restores, and foreign tools read it without this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

PyTree = Any

FIELDS = ("step", "params", "opt_state", "health", "rng", "data_position")
"""The state's parts, the keys of its checkpoint tree."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Parameters, optimizer state and the counters a resumed run needs to continue exactly.

    The fields are declared in the (sorted) key order of the checkpoint tree, so that flattening a
    ``TrainState`` gives its leaves in the order flattening its checkpoint mapping does: the compiled step's
    arguments are laid out as they were when the state was a dict.
    """

    data_position: jax.Array
    """Batches consumed from the data order (int32); the loader computes batch ``data_position`` next."""
    health: dict[str, jax.Array]
    """The health guards' windows and counters (``health.init_health``): loss/grad/update norms, skips."""
    opt_state: PyTree
    """The optimizer's state (optax), each leaf sharded like the parameter it shadows."""
    params: PyTree
    """The model parameters (float32 master weights)."""
    rng: jax.Array
    """Key data of the run's PRNG key (``jax.random.key_data``), seeded by ``TrainConfig.seed``."""
    step: jax.Array
    """Optimizer steps taken (int32); the schedule is evaluated at it."""

    def as_tree(self) -> dict[str, PyTree]:
        """The checkpoint layout: a mapping of the fields by name."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_tree(cls, tree: dict[str, PyTree]) -> TrainState:
        """The state of a checkpoint mapping (``as_tree``'s layout); a missing or extra part is an error."""
        missing, extra = set(FIELDS) - set(tree), set(tree) - set(FIELDS)
        if missing or extra:
            raise ValueError(
                f"a train-state tree has parts {sorted(tree)}; expected exactly {sorted(FIELDS)} "
                f"(missing {sorted(missing)}, unexpected {sorted(extra)})"
            )
        return cls(**{name: tree[name] for name in FIELDS})
