"""The console progress publisher moved into the engine (marin/status/console.py), which adds it to every
run that prints; this name stays for scripts that pass it explicitly."""

from marin.status.console import ConsoleProgress, last_line

__all__ = ["ConsoleProgress", "last_line"]
