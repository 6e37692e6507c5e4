"""Typed views of the unannotated jax entry points the trainer calls (jax 0.10).

`jax.lax.psum`, `all_to_all`, `psum_scatter`, `with_sharding_constraint`, `PartitionSpec(...)`,
`jax.ShapeDtypeStruct(...)`, `jax.block_until_ready` and `jax.make_array_from_process_local_data` carry no
annotations, so mypy --strict refuses every call to them ("no-untyped-call"). Each name below is the very jax
object, `cast` to the signature the trainer calls it with: call sites are checked, and nothing changes at run
time (`jax_typed.psum is jax.lax.psum`).

Annotate with the jax classes (`jax.sharding.PartitionSpec`, `jax.ShapeDtypeStruct`); build instances with
`P(...)` and `shape_dtype_struct(...)` from here.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, cast

import jax
import numpy as np
from jax.sharding import PartitionSpec, Sharding
from jax.typing import DTypeLike

AxisNames = str | tuple[str, ...]  # one mesh axis, or several reduced over together
SpecEntry = str | tuple[str, ...] | None  # one dimension of a PartitionSpec
_T = TypeVar("_T")


class _Psum(Protocol):
    def __call__(self, x: jax.Array, axis_name: AxisNames, /) -> jax.Array: ...


class _PsumScatter(Protocol):
    def __call__(self, x: jax.Array, axis_name: AxisNames, /, *, scatter_dimension: int = 0,
                 tiled: bool = False) -> jax.Array: ...


class _AllToAll(Protocol):
    def __call__(self, x: jax.Array, axis_name: AxisNames, split_axis: int, concat_axis: int, /, *,
                 tiled: bool = False) -> jax.Array: ...


class _WithShardingConstraint(Protocol):
    def __call__(self, x: jax.Array, shardings: Sharding, /) -> jax.Array: ...


class _PartitionSpecOf(Protocol):
    def __call__(self, *partitions: SpecEntry) -> PartitionSpec: ...


class _ShapeDtypeStructOf(Protocol):
    def __call__(self, shape: tuple[int, ...], dtype: DTypeLike, /, *, sharding: Sharding | None = None
                 ) -> jax.ShapeDtypeStruct: ...


class _BlockUntilReady(Protocol):
    def __call__(self, x: _T, /) -> _T: ...


class _FromProcessLocalData(Protocol):
    def __call__(self, sharding: Sharding, local_data: np.ndarray, global_shape: tuple[int, ...], /
                 ) -> jax.Array: ...


psum = cast(_Psum, jax.lax.psum)
psum_scatter = cast(_PsumScatter, jax.lax.psum_scatter)
all_to_all = cast(_AllToAll, jax.lax.all_to_all)
with_sharding_constraint = cast(_WithShardingConstraint, jax.lax.with_sharding_constraint)
P = cast(_PartitionSpecOf, PartitionSpec)
shape_dtype_struct = cast(_ShapeDtypeStructOf, jax.ShapeDtypeStruct)
block_until_ready = cast(_BlockUntilReady, jax.block_until_ready)
make_array_from_process_local_data = cast(_FromProcessLocalData, jax.make_array_from_process_local_data)
