"""Field-level explanations of why a step's hash changed (the plan's `changed` list).

`diff_identity(old, new)` compares two identity documents and returns lines such as
`config.lr: 0.001 -> 0.002` or `version: None -> '2'`. Dependency placeholders (`{"$dep": ...}`) are compared
by subpath only; a changed dependency is explained by the plan with the dependency's own differences.
"""

from __future__ import annotations

import json
from typing import Any

MISSING = object()


def _show(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_dep(value: Any) -> bool:
    return isinstance(value, dict) and "$dep" in value


def _walk(old: Any, new: Any, path: str, out: list[str]) -> None:
    if _is_dep(old) and _is_dep(new):
        if old.get("subpath") != new.get("subpath"):
            out.append(f"{path}: subpath {_show(old.get('subpath'))} -> {_show(new.get('subpath'))}")
        return
    if isinstance(old, dict) and isinstance(new, dict) and not _is_dep(old) and not _is_dep(new):
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if key != "$type" else f"{path} type"
            _walk(old.get(key, MISSING), new.get(key, MISSING), sub, out)
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _walk(a, b, f"{path}[{i}]", out)
        return
    if old != new or type(old) is not type(new):
        out.append(f"{path}: {_show(old)} -> {_show(new)}")


def diff_identity(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Field-level differences between two identity documents (dependencies' hashes excluded)."""
    out: list[str] = []
    for key in ("version", "pinned_output_path"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {_show(old.get(key))} -> {_show(new.get(key))}")
    _walk(old.get("config", {}), new.get("config", {}), "config", out)
    return out
