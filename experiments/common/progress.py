"""Deprecated: the console progress publisher moved into the engine (marin/status/console.py), which adds it
to every run that prints. These aliases keep old scripts working and warn where they are used
(docs/changelog.md)."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("ConsoleProgress", "last_line")


def __getattr__(name: str) -> Any:
    """`from experiments.common.progress import ConsoleProgress` keeps working and warns at the importing
    line (a warning raised while the module loads points into importlib, which the default filters hide)."""
    if name in _MOVED:
        from marin.status import console

        warnings.warn(f"experiments.common.progress.{name} is deprecated: import {name} from "
                      "marin.status.console", DeprecationWarning, stacklevel=2)
        return getattr(console, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
