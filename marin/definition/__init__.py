"""Step definitions: the `Step` value, config placeholders and canonical identity hashing."""

from marin.definition.identity import identity_of, step_hash
from marin.definition.placeholders import (
    OutputPathOf,
    PrefixPath,
    ThisOutputPath,
    output_path_of,
    prefix_path,
    runtime_field,
    this_output_path,
)
from marin.definition.step import Resources, Step
from marin.jsonio import canonical_json

__all__ = [
    "OutputPathOf",
    "PrefixPath",
    "Resources",
    "Step",
    "ThisOutputPath",
    "canonical_json",
    "identity_of",
    "output_path_of",
    "prefix_path",
    "runtime_field",
    "step_hash",
    "this_output_path",
]
