"""Deprecated: the console progress publisher moved into the engine (marin/status/console.py), which adds it
to every run that prints. This alias keeps old scripts working and warns (docs/changelog.md)."""

import warnings

from marin.status.console import ConsoleProgress, last_line

warnings.warn("experiments.common.progress is deprecated: import ConsoleProgress and last_line from "
              "marin.status.console", DeprecationWarning, stacklevel=2)

__all__ = ["ConsoleProgress", "last_line"]
