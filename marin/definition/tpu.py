"""The public TPU slice shapes: one table, read by `Resources(tpu=...)`, the feasibility check and the gang
launcher.

A slice is named `<generation>-<N>` as Google Cloud names accelerator types. For v4 and v5p, N counts
TensorCores (two per chip), so v5p-64 is 32 chips; for v5e (`v5litepod-N`) and v6e, N counts chips. Every
multi-host slice has 4 chips per host (a TPU VM); single-host v5e/v6e slices put all their chips (1, 4 or 8)
on one host. These are the shapes in Google's TPU documentation (and in Ray's `ray.util.tpu`, which derives
hosts from the topology with the same rule); the topology column is what `ray.util.tpu.slice_placement_group`
takes. Ray gives worker 0 of each slice the resource `TPU-<name>-head` and every host the resource named after
its slice, so the table never has to be written into a cluster config.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """One TPU slice type: `name` (e.g. "v5p-64"), `generation` ("v5p"), `topology` ("2x4x4"), chips,
    hosts."""

    name: str
    generation: str
    topology: str
    chips: int
    hosts: int

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def head_resource(self) -> str:
        """The resource Ray gives worker 0 of a slice of this type (one per slice)."""
        return f"TPU-{self.name}-head"


# (name, topology, chips, hosts)
_ROWS: tuple[tuple[str, str, int, int], ...] = (
    ("v4-8", "2x2x1", 4, 1),
    ("v4-16", "2x2x2", 8, 2),
    ("v4-32", "2x2x4", 16, 4),
    ("v4-64", "2x4x4", 32, 8),
    ("v4-128", "4x4x4", 64, 16),
    ("v4-256", "4x4x8", 128, 32),
    ("v4-512", "4x8x8", 256, 64),
    ("v4-1024", "8x8x8", 512, 128),
    ("v4-2048", "8x8x16", 1024, 256),
    ("v4-4096", "8x16x16", 2048, 512),
    ("v5p-8", "2x2x1", 4, 1),
    ("v5p-16", "2x2x2", 8, 2),
    ("v5p-32", "2x2x4", 16, 4),
    ("v5p-64", "2x4x4", 32, 8),
    ("v5p-128", "4x4x4", 64, 16),
    ("v5p-256", "4x4x8", 128, 32),
    ("v5p-512", "4x8x8", 256, 64),
    ("v5p-1024", "8x8x8", 512, 128),
    ("v5p-2048", "8x8x16", 1024, 256),
    ("v5p-4096", "8x16x16", 2048, 512),
    ("v5p-8192", "16x16x16", 4096, 1024),
    ("v5p-12288", "16x16x24", 6144, 1536),
    ("v5litepod-1", "1x1", 1, 1),
    ("v5litepod-4", "2x2", 4, 1),
    ("v5litepod-8", "2x4", 8, 1),
    ("v5litepod-16", "4x4", 16, 4),
    ("v5litepod-32", "4x8", 32, 8),
    ("v5litepod-64", "8x8", 64, 16),
    ("v5litepod-128", "8x16", 128, 32),
    ("v5litepod-256", "16x16", 256, 64),
    ("v6e-1", "1x1", 1, 1),
    ("v6e-4", "2x2", 4, 1),
    ("v6e-8", "2x4", 8, 1),
    ("v6e-16", "4x4", 16, 4),
    ("v6e-32", "4x8", 32, 8),
    ("v6e-64", "8x8", 64, 16),
    ("v6e-128", "8x16", 128, 32),
    ("v6e-256", "16x16", 256, 64),
)

SLICES: dict[str, SliceShape] = {
    name: SliceShape(name, name.split("-")[0], topology, chips, hosts)
    for name, topology, chips, hosts in _ROWS
}


def slice_shape(name: str) -> SliceShape:
    """The shape of slice type `name`; a KeyError whose message lists the valid names of its generation."""
    shape = SLICES.get(name)
    if shape is not None:
        return shape
    generation = name.split("-")[0] if isinstance(name, str) else ""
    same = [n for n in SLICES if n.split("-")[0] == generation]
    hint = (
        f"valid {generation} slices: {', '.join(same)}"
        if same
        else ("valid generations: v4-*, v5p-*, v5litepod-* (v5e), v6e-*")
    )
    raise KeyError(f"unknown TPU slice type {name!r}; {hint}")
