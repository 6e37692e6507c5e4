"""`Step`: a frozen value naming a function, its config and how to run it. Building one touches nothing.

A step's function must be importable by module path (workers import it), its config must be a frozen
dataclass, and dependencies are declared only through placeholders inside the config
(`output_path_of(other_step)`), so the DAG can be discovered from the steps an experiment names.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from marin.definition.tpu import slice_shape
from marin.errors import StepDefinitionError

RAW_INPUT_POLICIES = ("rerun", "warn")
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one attempt of a step needs from a worker. Never part of identity.

    `resources` holds custom and accelerator resources by name (e.g. `{"TPU": 4}`, `{"fake_gpu": 1}`);
    `memory` is in bytes. A **gang** step runs its function on several hosts at once, all or none:
    `hosts=N` asks for N workers on distinct nodes, each with the resources above; `tpu="v5p-64"` asks for a
    whole TPU slice (its hosts and chips per host come from the table in `marin/definition/tpu.py`), and
    `slices=K` for K such slices (multislice). The per-host fields then describe one host of the slice
    (CPUs, memory, custom resources); the TPU chips are added from the table.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    hosts: int = 1
    tpu: str | None = None
    slices: int = 1

    def __post_init__(self) -> None:
        for label, value in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)):
            if not isinstance(value, int | float) or value < 0:
                raise StepDefinitionError(f"Resources.{label} must be a number >= 0, got {value!r}")
        if self.memory is not None and (not isinstance(self.memory, int) or self.memory <= 0):
            raise StepDefinitionError("Resources.memory must be a positive int (bytes) or None, got "
                                      f"{self.memory!r}")
        for key, value in self.resources.items():
            if not isinstance(key, str) or not isinstance(value, int | float) or value <= 0:
                raise StepDefinitionError(f"Resources.resources[{key!r}] must map a name to a number > 0, "
                                          f"got {value!r}")
        object.__setattr__(self, "resources", MappingProxyType(dict(self.resources)))
        self._check_gang()

    def _check_gang(self) -> None:
        for label, value in (("hosts", self.hosts), ("slices", self.slices)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StepDefinitionError(f"Resources.{label} must be an int >= 1, got {value!r}")
        if self.tpu is None:
            if self.slices != 1:
                raise StepDefinitionError(
                    f"Resources.slices={self.slices} needs a TPU slice type: add tpu=..., e.g. "
                    f"Resources(tpu='v5p-64', slices={self.slices})")
            return
        try:
            shape = slice_shape(self.tpu)
        except KeyError as e:
            raise StepDefinitionError(f"Resources.tpu: {e.args[0]}") from None
        if self.hosts != 1:
            raise StepDefinitionError(
                f"Resources(tpu={self.tpu!r}) takes its host count from the slice ({shape.hosts}); "
                f"drop hosts={self.hosts} (use slices=K for several slices)")
        if self.num_gpus or "TPU" in self.resources:
            raise StepDefinitionError(
                f"Resources(tpu={self.tpu!r}) already asks for {shape.chips_per_host} TPU chips per host; "
                "drop "
                "num_gpus and resources['TPU']")

    @property
    def gang_size(self) -> int:
        """How many hosts run the step's function at once (1 for an ordinary step)."""
        if self.tpu is not None:
            return slice_shape(self.tpu).hosts * self.slices
        return self.hosts

    @property
    def is_gang(self) -> bool:
        """True when the step runs on several hosts (a single-host TPU slice is an ordinary task with its
        chips)."""
        return self.gang_size > 1

    def per_host(self) -> Resources:
        """What one gang member needs on its host: these resources with the slice's TPU chips added."""
        extra = {"TPU": float(slice_shape(self.tpu).chips_per_host)} if self.tpu is not None else {}
        return Resources(num_cpus=self.num_cpus, num_gpus=self.num_gpus, memory=self.memory,
                         resources={**self.resources, **extra})

    @classmethod
    def coerce(cls, value: Resources | Mapping[str, Any] | None) -> Resources:
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise StepDefinitionError(
                    f"unknown resource keys {unknown}; valid keys are {sorted(known)} "
                    "(put custom or accelerator resources under 'resources', e.g. {'resources': {'TPU': 4}})"
                )
            return cls(**value)
        raise StepDefinitionError("resources must be a Resources, a dict or None, got "
                                  f"{type(value).__name__}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            out["num_gpus"] = self.num_gpus
        if self.memory is not None:
            out["memory"] = self.memory
        if self.resources:
            out["resources"] = dict(self.resources)
        if self.hosts != 1:
            out["hosts"] = self.hosts
        if self.tpu is not None:
            out["tpu"] = self.tpu
        if self.slices != 1:
            out["slices"] = self.slices
        return out


def main_module_name() -> str | None:
    """The dotted name under which the `__main__` script could be imported (None if it cannot be)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    # Asked for twice per step (the step's and its config's import path in step.json): the answer depends
    # only on these three, and working it out normalises every sys.path entry (~20 path calls).
    return _main_module_name(path, os.getcwd(), tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _main_module_name(path: str, cwd: str, sys_path: tuple[str, ...]) -> str | None:
    path = os.path.abspath(path)
    # Prefer the working directory (experiments.hello_world), then the shortest sys.path root.
    others = sorted({os.path.abspath(p or cwd) for p in sys_path}, key=len)
    for root in [cwd, *others]:
        if path.startswith(root + os.sep) and path.endswith(".py"):
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if all(p.isidentifier() for p in parts):
                return ".".join(parts)
    return None


def fn_import_path(fn: Callable[..., Any] | type) -> str:
    """`module:qualname` of an importable function or class; `__main__` is mapped to the script's module."""
    module = fn.__module__
    if module == "__main__":
        module = main_module_name() or "__main__"
    return f"{module}:{fn.__qualname__}"


def _check_name(name: Any) -> None:
    """A step name is a relative path under the prefix: parts of letters, digits, '_', '-', '.' joined by
    '/'. A part made only of dots would be this or the parent directory, and one starting with '-' reads as a
    flag to every command-line tool that is handed the path (`rm`, `gsutil`, `marin --run-only`)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise StepDefinitionError(
            f"invalid step name {name!r}: use letters, digits, '_', '-', '.', with '/' between parts "
            "(e.g. 'tokenize/stdlib')"
        )
    for part in name.split("/"):
        if not part.strip("."):
            raise StepDefinitionError(
                f"invalid step name {name!r}: the part {part!r} is only dots, which a path reads as this or "
                "the parent directory; give every part a letter or digit (e.g. 'tokenize/v1.2')"
            )
        if part.startswith("-"):
            raise StepDefinitionError(
                f"invalid step name {name!r}: the part {part!r} starts with '-', which command-line tools "
                f"read as a flag; start it with a letter, digit or '_' (e.g. {part.lstrip('-') or 'x'!r})"
            )
    if ".marin" in name.split("/"):
        raise StepDefinitionError(f"invalid step name {name!r}: '.marin' is reserved for status files")


def _check_fn(name: str, fn: Any) -> None:
    if not callable(fn):
        raise StepDefinitionError(f"step {name}: fn must be a function, got {type(fn).__name__} ({fn!r})")
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if not qualname or not module or not inspect.isfunction(inspect.unwrap(fn)):
        raise StepDefinitionError(
            f"step {name}: fn {fn!r} is not a plain function; define it with `def` at module level"
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise StepDefinitionError(
            f"step {name}: fn {module}.{qualname} is a lambda or a closure; workers must import it by module "
            "path, so define it with `def` at the top level of a module and pass its settings through the "
            "config"
        )
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise StepDefinitionError(
            f"step {name}: fn {module}:{qualname} cannot be found again by importing {module} and reading "
            f"{qualname}; workers import it by that path, so define it at the top level of its module"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One node of an experiment's DAG: `fn(config)` writing under the step's output path.

    Identity (and so the output path `{prefix}/{name}-{hash8}`) covers the name, `version`, every config
    field except runtime fields, and the dependencies' hashes; `description`, `resources`, `retries`,
    `max_preemptions` and `env` do not count. Two budgets: `retries` further attempts after failures (the
    function raised, or was killed for memory), `max_preemptions` after interruptions (a node preempted or
    lost); see marin/execution/causes.py. Steps compare by object identity; equal-by-identity steps are
    merged by the graph.
    """

    name: str
    fn: Callable[[Any], Any]
    config: Any
    _: dataclasses.KW_ONLY
    description: str = ""
    resources: Resources | Mapping[str, Any] | None = None
    version: str | None = None
    retries: int = 0
    max_preemptions: int = 100
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    output_path_override: str | None = None
    raw_inputs: str | None = None
    """What a changed raw input does (docs/concepts.md, "Raw inputs"): "rerun" (its fingerprint is part of
    the identity: the step and its dependents re-run), "warn" (the plan warns; the result is reused), or
    None for the run's `--raw-inputs` policy (default "rerun")."""
    nondeterministic: tuple[str, ...] = ()
    """Globs (relative to the output path) of outputs that differ between identical runs (timings, wall-clock
    fields): recorded in the output manifest, left out when `marin reproduce` compares digests."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_fn(self.name, self.fn)
        if not dataclasses.is_dataclass(self.config) or isinstance(self.config, type):
            raise StepDefinitionError(
                f"step {self.name}: config must be a frozen dataclass instance, got "
                f"{type(self.config).__name__}"
            )
        if not type(self.config).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise StepDefinitionError(
                f"step {self.name}: config class {type(self.config).__qualname__} must be frozen "
                "(@dataclass(frozen=True)) so the step's identity cannot change after it is built"
            )
        if self.version is not None and not isinstance(self.version, str):
            raise StepDefinitionError(f"step {self.name}: version must be a str or None, got "
                                      f"{self.version!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise StepDefinitionError(f"step {self.name}: retries must be an int >= 0, got {self.retries!r}")
        if isinstance(self.max_preemptions, bool) or not isinstance(self.max_preemptions, int) or \
                self.max_preemptions < 0:
            raise StepDefinitionError(
                f"step {self.name}: max_preemptions must be an int >= 0 (attempts re-run after an "
                "interruption), "
                f"got {self.max_preemptions!r}")
        for key, value in dict(self.env).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise StepDefinitionError(f"step {self.name}: env must map str to str, got {key!r}: "
                                          f"{value!r}")
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.raw_inputs not in (*RAW_INPUT_POLICIES, None):
            raise StepDefinitionError(f"step {self.name}: raw_inputs={self.raw_inputs!r} is not a policy; "
                                      "use "
                                      f"one of {RAW_INPUT_POLICIES} or None (the run's --raw-inputs)")
        globs = self.nondeterministic
        if isinstance(globs, str) or not all(isinstance(p, str) for p in globs):
            raise StepDefinitionError(f"step {self.name}: nondeterministic must be a tuple of glob strings "
                                      f"(e.g. ('metrics.jsonl',)), got {self.nondeterministic!r}")
        object.__setattr__(self, "nondeterministic", tuple(self.nondeterministic))
        try:
            object.__setattr__(self, "resources", Resources.coerce(self.resources))
        except StepDefinitionError as e:
            raise StepDefinitionError(f"step {self.name}: {e}") from e

    @property
    def fn_path(self) -> str:
        return fn_import_path(self.fn)

    def with_output_path(self, path: str) -> Step:
        """Pin this step's output path (relative paths are under the prefix).

        The pinned path becomes the step's identity for its dependents, so upstream edits cannot re-address
        an expensive step by accident; a warning says when the computed path differs.
        """
        if not isinstance(path, str) or not path.strip("/"):
            raise StepDefinitionError(f"step {self.name}: with_output_path needs a non-empty path, got "
                                      f"{path!r}")
        return dataclasses.replace(self, output_path_override=path.rstrip("/"))

    def __repr__(self) -> str:
        pinned = f", output_path={self.output_path_override!r}" if self.output_path_override else ""
        return f"Step(name={self.name!r}, fn={self.fn_path}{pinned})"
