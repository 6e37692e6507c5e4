"""After-run hooks: work a run flag asks for once the run has ended (`--publish`: marin/publish/after_run.py).

Packages above the engine declare them under the `marin.after_run` entry point group, as status publishers are
declared under `marin.publishers`, so the engine never imports them. Each entry is a factory called with the
run's flags before anything runs: it returns None when its flag is off, raises ValueError (naming the flag and
the fix) when the flags are wrong, which stops the run before it starts, or returns a hook. A hook is called
with the run's prefix after the run (successful or not) and returns None, or an error record that joins the
run's publisher errors: it never fails the run.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from marin.execution.argv import ExecutorMainConfig

ENTRY_POINT_GROUP = "marin.after_run"
Hook = Callable[[str, bool], "dict[str, Any] | None"]  # (prefix, verbose) -> an error record or None


def hooks_for(config: ExecutorMainConfig) -> list[Hook]:
    """The hooks the run's flags ask for; a ValueError when the flags are wrong or a flag has no hook."""
    hooks: list[Hook] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        hook = ep.load()(config)
        if hook is not None:
            hooks.append(hook)
    if config.publish and not hooks:
        raise ValueError("--publish: the site publisher (marin.publish) is not installed in this "
                         "environment; install the project (`python3 dev.py install`, or `pip install -e .`) "
                         "and run again")
    return hooks


def run_hooks(hooks: list[Hook], prefix: str, verbose: bool) -> list[dict[str, Any]]:
    """Call every hook after the run; the error records of those that failed."""
    return [error for hook in hooks if (error := hook(prefix, verbose)) is not None]
