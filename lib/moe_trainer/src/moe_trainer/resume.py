"""Where a run starts, and what a finished run reports: the run directory read back.

``restore_or_init`` gives ``train`` its first state: the newest *complete* checkpoint restored onto this
configuration's shardings (a mismatch with the checkpoint is an error naming the fix), else a warm start from
``config.init_from`` (warm_start.py), else a fresh initialisation. A complete checkpoint that fails to restore
and is damaged (not a changed config) falls back: reported in one line (step, path, the underlying error),
moved aside (``{step}.corrupt-<time>``, never deleted) and the next older one tried; every fallback goes to
``checkpoint_fallbacks.jsonl`` in the run directory, to the progress file and to the ``TrainResult`` (the
steps redone: from the checkpoint resumed to the damaged one). When a run had already finished, ``train``
reports its end from the files it wrote: the last training row of metrics.jsonl and eval.json.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import jax

from moe_trainer import distributed
from moe_trainer.checkpoint import Checkpointer, one_line
from moe_trainer.compiled import Compiled
from moe_trainer.jax_typed import shape_dtype_struct
from moe_trainer.jsonl import JsonlFile, is_local
from moe_trainer.state import TrainState
from moe_trainer.train_config import TrainConfig

FALLBACKS_FILE = "checkpoint_fallbacks.jsonl"


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A checkpoint skipped on resume because it could not be restored (recorded in
    ``checkpoint_fallbacks.jsonl``, the progress file and the ``TrainResult``)."""

    step: int
    """The damaged checkpoint's step."""
    path: str
    """Its directory when it failed."""
    error: str
    """The underlying error, one line (``checkpoint.one_line``)."""
    moved_to: str
    """Where it was moved aside (``{step}.corrupt-<UTC time>``); nothing is deleted."""
    resumed_from: int | None = None
    """The checkpoint the run resumed from instead (None: none was readable; started fresh)."""
    resumed_time: float | None = None
    """The wall time of that checkpoint's state (its save began), for the time lost."""

    @property
    def steps_redone(self) -> int:
        """Steps trained again because of this checkpoint: from the one resumed to this one."""
        return self.step - (self.resumed_from or 0)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "steps_redone": self.steps_redone}

    def line(self) -> str:
        """The report, one line: step, path, error, what happens instead."""
        instead = (f"resuming from step {self.resumed_from}" if self.resumed_from is not None
                   else "no earlier checkpoint is readable: starting from step 0")
        return (f"checkpoint step {self.step} at {self.path} cannot be restored ({self.error}); moved aside "
                f"to {self.moved_to}; {instead} ({self.steps_redone} steps redone)")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where an invocation of ``train`` starts: its first state and the damaged checkpoints it skipped."""

    state: TrainState
    fallbacks: tuple[Fallback, ...] = ()
    restored_time: float | None = None
    """The restored checkpoint's wall time (from its meta); None when nothing was restored."""


def restore_or_init(comp: Compiled, ckpt: Checkpointer, config: TrainConfig) -> Start:
    """The newest checkpoint that restores, onto this run's shardings, or a fresh (or warm-started) state.

    A checkpoint that fails to restore is verified (``Checkpointer.layout_mismatch``): when its layout differs
    from this config's, the config changed and that is an error naming the fix; otherwise it is damaged, so
    it is reported in one line, moved aside and the next older one is tried.
    """
    abstract = jax.tree.map(
        lambda a, s: shape_dtype_struct(a.shape, a.dtype, sharding=s), comp.abstract_state, comp.shardings
    )
    fallbacks: list[Fallback] = []
    step = ckpt.latest_step()
    while step is not None:
        restored, failure = _try_restore(ckpt, step, abstract)
        if restored is not None:
            state, meta = restored
            saved = meta.get("time")
            saved_at = float(saved) if isinstance(saved, int | float) else None
            done = [dataclasses.replace(f, resumed_from=step, resumed_time=saved_at) for f in fallbacks]
            _report(done, config)
            return Start(state, tuple(done), saved_at)
        fallbacks.append(_skip_damaged(ckpt, step, abstract, failure, config))
        step = ckpt.latest_step()
    _report(fallbacks, config)
    if config.init_from:
        from moe_trainer.warm_start import warm_state, write_report

        state, report = warm_state(
            comp.init(), comp.shardings, config.model, config.init_from, config.warm_start, config.seed
        )
        print(write_report(report, config.output_dir), file=sys.stderr, flush=True)
        return Start(state, tuple(fallbacks))
    return Start(comp.init(), tuple(fallbacks))


def _try_restore(ckpt: Checkpointer, step: int, abstract: TrainState
                 ) -> tuple[tuple[TrainState, dict[str, Any]] | None, BaseException | None]:
    """((state, meta), None) when ``step`` restored on every process, else (None, this process's error)."""
    failure: BaseException | None = None
    restored = None
    try:
        restored = ckpt.restore(step, abstract)  # a TrainState, as ``abstract`` is one
    except Exception as e:  # judged below: damaged (skipped) or a changed config (an error)
        failure = e
    if distributed.all_processes(failure is None):
        return restored, None
    return None, failure or RuntimeError("the restore failed on another process of the run")


def _skip_damaged(ckpt: Checkpointer, step: int, abstract: TrainState, failure: BaseException | None,
                  config: TrainConfig) -> Fallback:
    """Verify that ``step`` failed because it is damaged (else raise the config-mismatch error), then move
    it aside (process 0; the others wait) and return its record."""
    try:
        mismatch = ckpt.layout_mismatch(step, abstract)
    except Exception:  # its own metadata is unreadable: damaged as well
        mismatch = None
    if mismatch is not None:
        raise ValueError(
            f"cannot resume from checkpoint step {step} in {ckpt.directory}: its train state does not match "
            f"this config's model/optimizer/health settings ({mismatch}). Use a new output_dir (or "
            "checkpoint.dir) for a changed configuration, or restore the original settings"
        ) from failure
    path = ckpt.step_path(step)
    error = one_line(failure) if failure is not None else "unknown error"
    moved = ckpt.move_aside(step) if distributed.is_primary() else f"{path}.corrupt-*"
    distributed.barrier(f"checkpoint_{step}_moved_aside", distributed.init_timeout_s(config.distributed))
    if not distributed.is_primary():
        ckpt.reload()
    return Fallback(step=step, path=path, error=error, moved_to=moved)


def _report(fallbacks: list[Fallback], config: TrainConfig) -> None:
    """Each skipped checkpoint: one line on stderr (the step's log) and one in checkpoint_fallbacks.jsonl."""
    if not fallbacks:
        return
    for f in fallbacks:
        print(f"[moe_trainer] {f.line()}", file=sys.stderr, flush=True)
    if not distributed.is_primary():
        return
    import fsspec

    path = f"{config.output_dir.rstrip('/')}/{FALLBACKS_FILE}"
    fs, p = fsspec.core.url_to_fs(path)
    local = is_local(path)
    before = [] if local or not fs.exists(p) else fs.read_text(p).splitlines(keepends=True)
    out = JsonlFile(fs, p, local=local, lines=before)
    for f in fallbacks:
        out.append(json.dumps({**f.to_json(), "time": time.time()}) + "\n")
    out.flush()


def last_train_row(path: str) -> dict[str, Any] | None:
    """The newest training row (one with a loss) of the metrics.jsonl at ``path``; None without one."""
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    with fs.open(p, "r") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    train_rows = [r for r in rows if "loss" in r]
    return train_rows[-1] if train_rows else None


