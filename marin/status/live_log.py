"""Attempt logs that can be read while the step runs, on object stores too (docs/formats.md, "Live logs").

On local storage the worker writes the attempt log in place, so it is always live. An object store has no
append: the worker captures output into a local file, and `LogShipper` copies what the file gained to the
store as numbered chunks, every `interval_s` seconds (or sooner after `max_bytes`), from a background thread:

    {log}.live/state               {"generation": g, "base_bytes": b}  or  {"final": true}
    {log}.live/g{g:06d}/{i:06d}    chunk i of generation g (UTF-8 text, cut on a character boundary)
    {log}                          the log's first b bytes (a consolidation), or the whole log once final

After `CHUNKS_PER_GENERATION` chunks the shipper consolidates: it uploads the whole log so far to `{log}`,
then starts generation g+1 by rewriting `state`. A reader therefore reads `state`, the first `base_bytes` of
`{log}` and the current generation's chunks (never more than CHUNKS_PER_GENERATION objects, however long the
run). When the attempt ends the worker uploads the whole log and marks the state final. If the worker's node
vanishes, what was shipped stays readable: the output up to the last chunk. `state` is written with the first
chunk, not before: an attempt that printed nothing yet has no live log (readers see no log, as for a local
attempt that has not started writing), and one that printed nothing before it ended (a step done within
`interval_s`) writes only its final log, one object instead of three (issue 35: two round trips fewer a step).

Readers use `read_log`; it also reads ordinary (local, or finished) logs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from marin import jsonio
from marin.storage.fs import Storage

CHUNKS_PER_GENERATION = 64
DEFAULT_INTERVAL_S = 2.0
DEFAULT_MAX_BYTES = 256 * 1024


def live_dir(log_path: str) -> str:
    return f"{log_path}.live"


def _state_path(log_path: str) -> str:
    return f"{live_dir(log_path)}/state"


def _generation_dir(log_path: str, generation: int) -> str:
    return f"{live_dir(log_path)}/g{generation:06d}"


def _complete_utf8(data: bytes) -> bytes:
    """The longest prefix of `data` that does not end inside a multi-byte UTF-8 character."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            data[:cut].decode("utf-8")
            return data[:cut]
        except UnicodeDecodeError as e:
            if e.start < cut - 3:  # invalid earlier on (not a cut character): ship it as it is
                return data
    return data


class LogShipper:
    """Ships what the local file `local_path` gains to `log_path` on `storage` as numbered chunks."""

    def __init__(
        self,
        storage: Storage,
        local_path: str,
        log_path: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.storage, self.local_path, self.log_path = storage, local_path, log_path
        self.interval_s, self.max_bytes = interval_s, max_bytes
        self.shipped = 0  # bytes of the local file already on the store
        self.generation, self.chunk = 0, 0
        self.state_written = False  # `state` is written with the first chunk (module docstring)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="marin-log-shipper", daemon=True)
        self.errors: list[str] = []

    def start(self) -> LogShipper:
        self._thread.start()
        return self

    def _write_state(self, state: dict[str, Any]) -> None:
        jsonio.write_json(self.storage, _state_path(self.log_path), state)
        self.state_written = True

    def _loop(self) -> None:
        while not self._stop.wait(self._wait()):
            try:
                self.ship()
            except Exception as e:  # a store hiccup must not kill the step; the next tick retries
                self.errors.append(f"{type(e).__name__}: {e}")

    def _wait(self) -> float:
        """Sleep the interval, but come back sooner when a lot of output is waiting (checked in steps)."""
        waited = 0.0
        step = min(0.25, self.interval_s)
        while waited < self.interval_s and not self._stop.is_set():
            if self._pending() >= self.max_bytes:
                return 0.0
            self._stop.wait(step)
            waited += step
        return 0.0

    def _pending(self) -> int:
        try:
            return os.path.getsize(self.local_path) - self.shipped
        except OSError:
            return 0

    def ship(self) -> None:
        """Upload what the file gained since the last chunk (consolidating every CHUNKS_PER_GENERATION)."""
        with open(self.local_path, "rb") as f:
            f.seek(self.shipped)
            data = _complete_utf8(f.read())
        if not data:
            return
        if not self.state_written:  # before the first chunk, so a reader finds it
            self._write_state({"generation": self.generation, "base_bytes": 0})
        path = f"{_generation_dir(self.log_path, self.generation)}/{self.chunk:06d}"
        self.storage.write_text(path, data.decode("utf-8", errors="replace"))
        self.shipped += len(data)
        self.chunk += 1
        if self.chunk >= CHUNKS_PER_GENERATION:
            self._consolidate()

    def _consolidate(self) -> None:
        with open(self.local_path, "rb") as f:
            base = f.read(self.shipped)
        self.storage.write_text(self.log_path, base.decode("utf-8", errors="replace"))
        self.generation, self.chunk = self.generation + 1, 0
        self._write_state({"generation": self.generation, "base_bytes": len(base)})

    def finish(self) -> None:
        """Stop the thread, then upload the whole log and mark it final (the attempt ended)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with open(self.local_path, "rb") as f:
            self.storage.write_text(self.log_path, f.read().decode("utf-8", errors="replace"))
        if self.state_written:  # else no reader ever saw a live log: the plain log is all there is
            self._write_state({"final": True})


def read_log(storage: Storage, log_path: str) -> str | None:
    """The attempt log's text so far: whole once final (or on local storage), else base plus live chunks."""
    live = read_live_log(storage, log_path)
    return live if live is not None else storage.read_text(log_path)


def read_live_log(storage: Storage, log_path: str) -> str | None:
    """The text of a log that is still being shipped (base plus the current chunks); None for any other log
    (local, finished, or never shipped), which is read as the plain file `log_path`."""
    state = jsonio.read_json(storage, _state_path(log_path)) if "://" in log_path else None
    if state is None:
        return None
    if state.get("final"):
        return None
    base_bytes = int(state.get("base_bytes") or 0)
    base = (storage.read_text(log_path) or "") if base_bytes else ""
    base = base.encode("utf-8")[:base_bytes].decode("utf-8", errors="replace")
    directory = _generation_dir(log_path, int(state.get("generation") or 0))
    chunks = sorted(storage.listdir(directory) or [])
    return base + "".join(storage.read_text(f"{directory}/{name}") or "" for name in chunks)
