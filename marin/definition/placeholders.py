"""Placeholders that stand for paths inside a step's config until just before its function runs.

- `output_path_of(step, subpath)`: a dependency's output path (this is how dependencies are declared);
- `this_output_path(subpath)`: the step's own output path;
- `prefix_path("raw/x")`: data already under the prefix, outside the DAG;
- `runtime_field(default=...)`: a config field that does not change results (worker counts, logging
  intervals) and so stays out of the step's identity.

Identity sees placeholders by their logical value (a dependency's hash plus subpath), never by a physical
path, so the same DAG under two prefixes has the same hashes.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marin.definition.step import Step

RUNTIME_FIELD_KEY = "marin.runtime"


def _check_subpath(subpath: str | None, what: str) -> str | None:
    if subpath is None:
        return None
    if not isinstance(subpath, str):
        raise TypeError(f"{what}: subpath must be a str, got {type(subpath).__name__} ({subpath!r})")
    cleaned = subpath.strip("/")
    if not cleaned or ".." in cleaned.split("/"):
        raise ValueError(f"{what}: subpath {subpath!r} must be a non-empty relative path without '..'")
    return cleaned


def join(base: str, subpath: str | None) -> str:
    """Join a path (local or URL) and an optional relative subpath with '/'."""
    return base if not subpath else posixpath.join(base.rstrip("/"), subpath)


@dataclasses.dataclass(frozen=True, eq=False)
class OutputPathOf:
    """The output path of `step` (plus `subpath`); makes `step` a dependency of the step whose config holds
    it."""

    step: Step
    subpath: str | None = None

    def __post_init__(self) -> None:
        from marin.definition.step import Step

        if not isinstance(self.step, Step):
            raise TypeError(f"output_path_of expects a Step, got {type(self.step).__name__} ({self.step!r})")
        object.__setattr__(self, "subpath", _check_subpath(self.subpath, f"output_path_of({self.step.name})"))

    def __repr__(self) -> str:
        sub = f", {self.subpath!r}" if self.subpath else ""
        return f"output_path_of({self.step.name!r}{sub})"


@dataclasses.dataclass(frozen=True)
class ThisOutputPath:
    """The output path of the step whose config holds it (plus `subpath`)."""

    subpath: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "subpath", _check_subpath(self.subpath, "this_output_path"))

    def __repr__(self) -> str:
        return f"this_output_path({self.subpath!r})" if self.subpath else "this_output_path()"


@dataclasses.dataclass(frozen=True)
class PrefixPath:
    """A path relative to the prefix, for data that is already there and not produced by a step."""

    path: str

    def __post_init__(self) -> None:
        cleaned = _check_subpath(self.path, "prefix_path")
        object.__setattr__(self, "path", cleaned)

    def __repr__(self) -> str:
        return f"prefix_path({self.path!r})"


def output_path_of(step: Step, subpath: str | None = None) -> Any:
    """Placeholder for `step`'s output path (joined with `subpath`); declares the dependency on `step`.

    Typed `Any` so it can sit in a config field annotated `str`.
    """
    return OutputPathOf(step, subpath)


def this_output_path(subpath: str | None = None) -> Any:
    """Placeholder for the current step's own output path (joined with `subpath`)."""
    return ThisOutputPath(subpath)


def prefix_path(path: str) -> Any:
    """Placeholder for `{prefix}/{path}`: existing data under the prefix, outside the DAG."""
    return PrefixPath(path)


def runtime_field(*, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that is a runtime option: it is passed to the function but not hashed into identity.

    Use it only for knobs that cannot change results (worker counts, logging intervals, progress bars).
    """
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={RUNTIME_FIELD_KEY: True})


def is_runtime_field(field: dataclasses.Field[Any]) -> bool:
    return bool(field.metadata.get(RUNTIME_FIELD_KEY, False))
