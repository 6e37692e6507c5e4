"""Canonical identity: a step's hash is sha256 over a canonical JSON of its identity inputs.

Identity inputs are the step's name, its `version`, every config field except runtime fields, and its
dependencies' hashes. Placeholders are encoded by logical value (`{"$dep": <hash>, "subpath": ...}`,
`{"$this": ...}`, `{"$prefix": ...}`), never by physical path, so the prefix, the region, the backend and
the resources never enter a hash. Encoding refuses anything it cannot serialize deterministically
(functions, objects with a default repr, non-string dict keys, NaN and infinities) with an error naming the
step and the field path, instead of silently hashing `str(obj)`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import pathlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from marin.definition.placeholders import OutputPathOf, PrefixPath, ThisOutputPath, is_runtime_field, join
from marin.definition.step import Step
from marin.errors import StepDefinitionError
from marin.jsonio import canonical_sha256

HASH_SCHEME = 1  # bump only with a migration note: every output path would change


def _refuse(step_name: str, path: str, value: Any, why: str) -> StepDefinitionError:
    shown = repr(value)
    shown = shown if len(shown) < 120 else shown[:117] + "..."
    return StepDefinitionError(
        f"step {step_name}: config field {path} = {shown} cannot be hashed deterministically: {why}"
    )


def encode(value: Any, *, step_name: str, path: str, dep_hash: Callable[[Step], str]) -> Any:
    """Encode one config value for identity (placeholders by logical value); raises on anything ambiguous."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, float) and not isinstance(value, enum.Enum):
        if not math.isfinite(value):
            raise _refuse(step_name, path, value, "NaN and infinities have no canonical JSON form")
        return value
    if isinstance(value, OutputPathOf):
        return {"$dep": dep_hash(value.step), "subpath": value.subpath}
    if isinstance(value, Step):
        return {"$dep": dep_hash(value), "subpath": None}
    if isinstance(value, ThisOutputPath):
        return {"$this": value.subpath}
    if isinstance(value, PrefixPath):
        return {"$prefix": value.path}
    if isinstance(value, enum.Enum):
        return {"$enum": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"$type": type(value).__qualname__}
        out.update(encode_fields(value, step_name=step_name, path=path, dep_hash=dep_hash))
        return out
    if isinstance(value, list | tuple):
        return [encode(v, step_name=step_name, path=f"{path}[{i}]", dep_hash=dep_hash) for i,
                v in enumerate(value)]
    if isinstance(value, Mapping):
        encoded = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise _refuse(step_name, path, value,
                              f"dict key {key!r} is not a str (JSON keys must be strings)")
            encoded[key] = encode(v, step_name=step_name, path=f"{path}.{key}", dep_hash=dep_hash)
        return encoded
    if callable(value):
        raise _refuse(step_name, path, value,
                      "functions and callables are not values; pass a name or a config")
    raise _refuse(
        step_name,
        path,
        value,
        f"type {type(value).__qualname__} is not a dataclass, str, int, float, bool, None, list, tuple, "
        "str-keyed dict, Enum or Path; convert it to one of these",
    )


def encode_fields(config: Any, *, step_name: str, path: str, dep_hash: Callable[[Step], str]) -> dict[str,
                                                                                                      Any]:
    """Encode a dataclass's identity fields (runtime fields left out)."""
    return {
        f.name: encode(getattr(config, f.name), step_name=step_name, path=f"{path}.{f.name}",
                       dep_hash=dep_hash)
        for f in dataclasses.fields(config)
        if not is_runtime_field(f)
    }


def identity_of(step: Step, dep_hash: Callable[[Step], str], deps: list[Step] | None = None) -> dict[str,
                                                                                                     Any]:
    """The identity document of `step`, given a function returning each dependency's hash (and, optionally,
    its direct dependencies, when the caller already collected them)."""
    config = encode_fields(step.config, step_name=step.name, path="config", dep_hash=dep_hash)
    dep_hashes = sorted({dep_hash(d) for d in (direct_dependencies(step) if deps is None else deps)})
    return {"name": step.name, "version": step.version, "config": config, "dependencies": dep_hashes}


def pinned_identity_of(step: Step) -> dict[str, Any]:
    """Identity of a step whose output path is pinned: the pinned path is what dependents depend on."""
    return {"name": step.name, "pinned_output_path": step.output_path_override}


def step_hash(identity: Mapping[str, Any]) -> str:
    """sha256 (64 hex digits) of the canonical JSON of an identity document."""
    return canonical_sha256(identity)


def iter_placeholders(value: Any, path: str = "config") -> Iterator[tuple[str, Any]]:
    """Yield (field path, placeholder or Step) for every placeholder inside a config value."""
    if isinstance(value, OutputPathOf | ThisOutputPath | PrefixPath | Step):
        yield path, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from iter_placeholders(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from iter_placeholders(v, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        for key, v in value.items():
            yield from iter_placeholders(v, f"{path}.{key}")


def direct_dependencies(step: Step) -> list[Step]:
    """The steps `step`'s config refers to, in field order, without duplicates (by object identity)."""
    seen: dict[int, Step] = {}
    for _, ph in iter_placeholders(step.config):
        dep = ph.step if isinstance(ph, OutputPathOf) else ph if isinstance(ph, Step) else None
        if dep is not None and id(dep) not in seen:
            seen[id(dep)] = dep
    return list(seen.values())


def resolve(value: Any, *, own_path: str, prefix: str, dep_path: Callable[[Step], str]) -> Any:
    """Replace every placeholder in a config value by its real path; other values are returned as is."""
    if isinstance(value, OutputPathOf):
        return join(dep_path(value.step), value.subpath)
    if isinstance(value, Step):
        return dep_path(value)
    if isinstance(value, ThisOutputPath):
        return join(own_path, value.subpath)
    if isinstance(value, PrefixPath):
        return join(prefix, value.path)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = resolve(old, own_path=own_path, prefix=prefix, dep_path=dep_path)
            if new is not old:
                if not f.init:
                    raise StepDefinitionError(
                        f"field {type(value).__qualname__}.{f.name} holds a placeholder but has init=False; "
                        "placeholders can only sit in fields the constructor accepts"
                    )
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, list | tuple):
        items = [resolve(v, own_path=own_path, prefix=prefix, dep_path=dep_path) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, Mapping):
        resolved = {k: resolve(v, own_path=own_path, prefix=prefix, dep_path=dep_path) for k,
                    v in value.items()}
        if all(resolved[k] is value[k] for k in value):
            return value
        return type(value)(resolved) if isinstance(value, dict) else resolved
    return value


def to_jsonable(value: Any) -> Any:
    """A JSON view of a resolved config for step.json (best effort: unknown leaves become their repr)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return repr(value) if not isinstance(value, pathlib.PurePath) else str(value)


# ----- raw inputs: config values that may name an existing path outside the DAG (docs/concepts.md) ---------
OUTPUT_FIELDS = frozenset({"output_path"})  # a step's own output: never an input, whatever it holds
_URL = re.compile(r"^(s3|gs|gcs|file|az|abfs|abfss|hdfs)://.")


def _names_a_path(value: str) -> bool:
    return value.startswith("/") or bool(_URL.match(value))


def raw_input_candidates(config: Any) -> list[tuple[str, str | PrefixPath]]:
    """(field path, value) of every identity field value that may name a raw input: an absolute local path
    or an object-store URL (a string or a Path; globs too), a `prefix_path(...)` placeholder, and what the
    config's own `raw_input_paths()` method returns (files a step reads that no field names, e.g. shipped task
    files). Fields named `output_path` and runtime fields are left out; whether a candidate exists is for
    the caller (marin/graph/raw_inputs.py) to find out."""
    out: list[tuple[str, str | PrefixPath]] = []
    stack: list[tuple[str, Any]] = [("config", config)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, OutputPathOf | ThisOutputPath | Step):
            continue  # a path inside the DAG: produced by a step, never a raw input
        if isinstance(value, PrefixPath):
            out.append((path, value))
        elif isinstance(value, str | pathlib.PurePath) and _names_a_path(str(value)):
            out.append((path, str(value)))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            stack.extend((f"{path}.{f.name}", getattr(value, f.name))
                         for f in reversed(dataclasses.fields(value))
                         if not is_runtime_field(f) and f.name not in OUTPUT_FIELDS)
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, Mapping):
            stack.extend((f"{path}.{k}", v) for k, v in reversed(list(value.items())) if isinstance(k, str))
    declared = getattr(config, "raw_input_paths", None)
    if callable(declared):
        out.extend((f"config.raw_input_paths()[{i}]", str(p)) for i, p in enumerate(declared()))
    return out
