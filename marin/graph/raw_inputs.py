"""Raw inputs of a DAG's steps: found in their configs, fingerprinted once per plan, put into identity.

A raw input is a config value naming an existing path that no step of the DAG produces
(`marin.definition.identity.raw_input_candidates`: absolute paths, object-store URLs, globs, `prefix_path`
placeholders, a config's `raw_input_paths()`). Each distinct path is fingerprinted once
(marin/storage/fingerprints.py); a candidate that does not exist is not an input (it may be a path the step
writes). Under the `rerun` policy (the default) the step's identity gets `"raw_inputs": {field: digest}`, so
new bytes at the same path give the step - and, through its hash, every dependent - a new output path; under
`warn` identity is left as it was before fingerprints existed and the plan warns when an input changed.
Either way step.json records the policy and every fingerprint (`record`), which is what the plan compares
with to say what changed (`changes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from marin.definition.identity import raw_input_candidates
from marin.definition.placeholders import PrefixPath, join
from marin.definition.step import RAW_INPUT_POLICIES, Step
from marin.storage.base import Storage
from marin.storage.fingerprints import Fingerprint, InputFingerprintError, fingerprint_all
from marin.storage.fs import normalize_prefix, storage_for

RERUN, WARN = RAW_INPUT_POLICIES


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """One step's raw inputs: its policy and a fingerprint per config field path."""

    policy: str
    fingerprints: dict[str, Fingerprint]

    def identity_component(self) -> dict[str, str] | None:
        """What enters identity: {field path: digest} under `rerun`, else None (identity as before)."""
        if self.policy != RERUN or not self.fingerprints:
            return None
        return {field: fp.digest for field, fp in sorted(self.fingerprints.items())}

    def record(self) -> dict[str, Any]:
        """step.json's `raw_inputs`."""
        return {"policy": self.policy,
                "inputs": {field: fp.to_json() for field, fp in sorted(self.fingerprints.items())}}

    def changes(self, recorded: dict[str, Any] | None) -> list[str]:
        """What differs from a step.json's `raw_inputs` (None: recorded before fingerprints), in words."""
        if not self.fingerprints:
            return []
        if not isinstance(recorded, dict):
            first = next(iter(sorted(self.fingerprints.values(), key=lambda f: f.path)))
            n = len(self.fingerprints)
            return [f"raw inputs are fingerprinted now (issue 35): {n} raw input(s) of this "
                    f"step enter its identity ({first.path}{', ...' if len(self.fingerprints) > 1 else ''})"]
        old = recorded.get("inputs") or {}
        out = [] if recorded.get("policy") == self.policy else [
            f"raw-input policy {recorded.get('policy')} -> {self.policy}"]
        for field, fp in sorted(self.fingerprints.items()):
            before = old.get(field)
            if isinstance(before, dict) and before.get("path") == fp.path and \
                    before.get("digest") != fp.digest:
                out.append(f"raw input {fp.path}: {fp.changes_since(before)}")
            elif before is None:
                out.append(f"raw input {fp.path}: new (config field {field})")
        return out


@dataclasses.dataclass
class RawInputs:
    """Reads the raw inputs of the steps of a DAG planned under `prefix`, with the run's default policy."""

    prefix: str
    policy: str = RERUN
    storage_of: Callable[[str], Storage] = storage_for

    def __post_init__(self) -> None:
        if self.policy not in RAW_INPUT_POLICIES:
            raise ValueError(f"--raw-inputs {self.policy!r} is not one of {RAW_INPUT_POLICIES}")

    def _resolve(self, value: str | PrefixPath) -> str:
        if isinstance(value, PrefixPath):
            return join(self.prefix, value.path)
        return normalize_prefix(value) if value.startswith("file://") else value

    def read(self, steps: Sequence[Step]) -> dict[int, StepInputs]:
        """Every step's raw inputs (by `id(step)`); each distinct path fingerprinted once. Raises
        InputFingerprintError (a StorageError) naming the step and the path when one cannot be read."""
        wanted = {id(s): [(field, self._resolve(v)) for field, v in raw_input_candidates(s.config)]
                  for s in steps}
        try:
            found = fingerprint_all((p for pairs in wanted.values() for _, p in pairs), self.storage_of)
        except InputFingerprintError as e:
            users = [s.name for s in steps if any(p == e.path for _, p in wanted[id(s)])]
            raise InputFingerprintError(f"step {', '.join(users[:3])}: {e}", e.path) from e
        out = {}
        for s in steps:
            fps = {field: fp for field, p in wanted[id(s)] if (fp := found.get(p)) is not None}
            out[id(s)] = StepInputs(s.raw_inputs or self.policy, fps)
        return out
