"""The hash of a step function's source text: recorded in step.json to warn about code drift.

Code never enters identity (docs/architecture.md, "Code is not hashed; drift is warned about"); the plan
compares this hash with the recorded one and warns when a reused result came from different code.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

_SOURCE_HASHES: dict[int, str | None] = {}


def fn_source_hash(fn: Callable[..., Any]) -> str | None:
    """sha256 of the function's source text (None when the source is unavailable)."""
    key = id(fn)
    if key not in _SOURCE_HASHES:
        try:
            _SOURCE_HASHES[key] = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
        except (OSError, TypeError):
            _SOURCE_HASHES[key] = None
    return _SOURCE_HASHES[key]
