"""Checkpoints with orbax-checkpoint: asynchronous, keep-last-K, complete-or-ignored, local or gs://.

Layout: ``{dir}/{step}/state`` (the whole train state: params, optimizer state, step, data position, RNG key
data and the health windows, see ``state.py``; a ``TrainState`` is stored as its mapping, ``as_tree``) and
``{dir}/{step}/meta`` (JSON: the model config, the train config, the step and the wall time), written by one
``orbax.checkpoint.CheckpointManager``.

Complete-or-ignored: orbax writes a step into ``{step}.orbax-checkpoint-tmp*`` and renames it (local disks) or
writes ``commit_success.txt`` (object stores) only after every array and the metadata are durable. The
manager lists only finalized steps, so a save interrupted by a crash or preemption never becomes the restore
point; ``cleanup_tmp_directories`` removes its leftovers when the next run opens the directory.

Multi-host: every process of the run calls ``save`` and ``restore`` with the same global arrays; orbax writes
each process's shards itself (tensorstore, per-process OCDBT files merged at commit) and process 0 writes the
metadata and commits the step only after a barrier that every process reaches once its writes are durable.
A gang killed in the middle of a save therefore leaves an uncommitted temporary directory that is never
listed, whichever member died first. The layout does not depend on the process count: a checkpoint written by
N processes restores in one and the reverse (onto whatever shardings the restoring mesh asks for).
``latest_step`` is process 0's answer broadcast to all, so every member restores the same step even if a
listing raced with a straggler's commit.

Damaged checkpoints: a committed step can still fail to restore (a file truncated or overwritten on disk, a
bucket object replaced). ``layout_mismatch`` tells such damage (the saved layout matches this config's, or
the checkpoint's own metadata is unreadable) from a changed configuration (the layouts differ), and
``move_aside`` renames a damaged step's directory to ``{step}.corrupt-<UTC time>``: kept for inspection, no
longer listed (orbax lists step numbers only), and out of the way of the save that will write that step
again. ``one_line`` reduces orbax/TensorStore's multi-line errors to their innermost cause's first line.
``resume.py`` decides what to do with them.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from moe_trainer.state import TrainState

if TYPE_CHECKING:
    from moe_trainer.model import Model

PyTree = Any


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to write checkpoints."""

    dir: str | None = None
    """Checkpoint directory (local path or gs://...); default {output_dir}/checkpoints."""
    every_steps: int = 1000
    """Save every this many steps (and always at the end of the run)."""
    keep: int = 3
    """Keep the last this many checkpoints (older ones are deleted in the background)."""
    async_save: bool = True
    """Write checkpoints in a background thread while training continues."""

    def __post_init__(self) -> None:
        if self.every_steps < 1 or self.keep < 1:
            raise ValueError(
                f"checkpoint.every_steps={self.every_steps} and checkpoint.keep={self.keep} must be >= 1"
            )


class Checkpointer:
    """A thin wrapper over ``ocp.CheckpointManager`` with the train state + JSON meta layout."""

    def __init__(self, directory: str, cfg: CheckpointConfig) -> None:
        self.directory = directory
        self.cfg = cfg
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep,
            enable_async_checkpointing=cfg.async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._manager = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        """The newest *complete* checkpoint's step, or None (in a multi-host run: process 0's, for all)."""
        step: int | None = self._manager.latest_step()
        if jax.process_count() == 1:
            return step
        from jax.experimental import multihost_utils

        agreed = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if step is None else step)))
        return None if agreed < 0 else agreed

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: PyTree, meta: dict[str, Any]) -> None:
        """Start saving ``state`` (a ``TrainState`` or any pytree) at ``step`` (returns once the arrays are
        copied; writes continue async)."""
        tree = state.as_tree() if isinstance(state, TrainState) else state
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(self, step: int, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
        """Restore ``step`` onto the shardings/dtypes of ``abstract_state`` (``jax.ShapeDtypeStruct``
        leaves; a ``TrainState`` of them restores a ``TrainState``)."""
        if step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no complete checkpoint for step {step} under {self.directory}; complete steps: "
                f"{self.all_steps()}"
            )
        typed = isinstance(abstract_state, TrainState)
        item = abstract_state.as_tree() if typed else abstract_state
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=item, restore_args=_restore_args(item)),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return (TrainState.from_tree(out["state"]) if typed else out["state"]), dict(out["meta"])

    def step_path(self, step: int) -> str:
        """The directory of one step's checkpoint."""
        return f"{self.directory.rstrip('/')}/{step}"

    def layout_mismatch(self, step: int, abstract_state: PyTree) -> str | None:
        """How the train state saved at ``step`` differs in layout (the names, shapes and dtypes of its
        arrays, from its own metadata) from ``abstract_state``, naming the first array that differs; None
        when they agree, so a restore of it that failed failed on damaged data. Raises when the checkpoint's
        metadata cannot be read (damage too)."""
        from etils import epath

        handler = ocp.PyTreeCheckpointHandler()
        try:
            tree = handler.metadata(epath.Path(self.step_path(step)) / "state")
        finally:
            handler.close()
        tree = getattr(tree, "tree", tree)
        item = abstract_state.as_tree() if isinstance(abstract_state, TrainState) else abstract_state
        saved = {leaf.name: leaf for leaf in jax.tree.leaves(tree, is_leaf=lambda x: hasattr(x, "shape"))}
        wanted = {_dotted(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(item)[0]}
        for name in sorted(saved.keys() | wanted.keys()):
            have, want = saved.get(name), wanted.get(name)
            if have is None or want is None or _shape_dtype(have) != _shape_dtype(want):
                return (f"{name}: saved {_describe(have)}, this config {_describe(want)} "
                        f"({len(saved)} arrays saved, {len(wanted)} in this config)")
        return None

    def move_aside(self, step: int) -> str:
        """Rename the damaged checkpoint of ``step`` to ``{step}.corrupt-<UTC time>`` (never deleted); the
        step is no longer listed, and a later save of it writes a fresh directory. Returns the new path."""
        from etils import epath  # orbax's own path layer: its cached listings see the move

        src = epath.Path(self.step_path(step))
        dst = epath.Path(f"{src}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        src.rename(dst)
        if src.exists():  # an object store's copy + delete can leave the directory's placeholder object
            src.rmtree()
        self.reload()
        return str(dst)

    def reload(self) -> None:
        """Re-read the list of steps from storage (after another process moved one aside)."""
        self._manager.reload()

    def read_meta(self, step: int) -> dict[str, Any]:
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def restore_params(self, step: int, abstract_params: PyTree) -> PyTree:
        """Restore only the parameters of a checkpoint (no optimizer state is read)."""
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item={"params": abstract_params},
                    restore_args={"params": _restore_args(abstract_params)},
                    partial_restore=True,
                )
            ),
        )
        return out["state"]["params"]

    def restore_raw(self, step: int) -> PyTree:
        """The whole train state of ``step`` as saved, as numpy arrays, without a target tree: how a warm
        start
        reads a checkpoint of *another* configuration (its tree and shapes are whatever that run had)."""
        import numpy as np

        tree = self._manager.item_metadata(step)["state"]
        tree = getattr(tree, "tree", tree)
        restore_args = jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree, is_leaf=lambda x: hasattr(x, "shape")
        )
        with warnings.catch_warnings():  # numpy leaves: no sharding (or topology) is involved
            warnings.filterwarnings("ignore", message="Sharding info not provided when restoring")
            out = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(restore_args=restore_args))
            )
        return out["state"]

    def saving(self) -> bool:
        """Whether a save is still in flight (its checkpoint is not complete yet)."""
        return bool(self._manager.is_saving_in_progress())

    def wait(self) -> None:
        """Block until the in-flight save (if any) is durable."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _dotted(path: tuple[Any, ...]) -> str:
    """A tree path as orbax names the array (``opt_state.inner_states.decay.inner_state.0.mu``)."""
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _shape_dtype(leaf: Any) -> tuple[tuple[int, ...], str]:
    return tuple(leaf.shape), str(np.dtype(leaf.dtype))


def _describe(leaf: Any) -> str:
    if leaf is None:
        return "nothing"
    shape, dtype = _shape_dtype(leaf)
    return f"{dtype}{list(shape)}"


def one_line(error: BaseException, limit: int = 300) -> str:
    """``error`` in one line: the innermost exception of its chain (TensorStore's own message, not orbax's
    60-line dump of the TensorStore spec), type and first line, at most ``limit`` characters."""
    inner, seen = error, {id(error)}
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    text = next((line.strip() for line in str(inner).splitlines() if line.strip()), "")
    text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _restore_args(abstract: PyTree) -> PyTree:
    """Per-leaf restore arguments: onto the leaf's sharding when it has one, else the default device."""

    def one(leaf: Any) -> ocp.RestoreArgs:
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return ocp.ArrayRestoreArgs(sharding=sharding, dtype=leaf.dtype, global_shape=leaf.shape)

    return jax.tree.map(one, abstract)


def _resolve(path: str) -> tuple[str, int | None]:
    """Accept a run's output dir, its checkpoints dir, or one step's dir; return (manager dir, step or
    None)."""
    from etils import epath

    p = epath.Path(path)
    if (p / "checkpoints").exists():
        return str(p / "checkpoints"), None
    if (p / "state").exists() and p.name.isdigit():
        return str(p.parent), int(p.name)
    return str(p), None


def read_foreign_checkpoint(path: str, step: int | None = None) -> tuple[PyTree, dict[str, Any], int]:
    """(train state as numpy arrays, meta, step) of a checkpoint of any configuration; for warm starts.

    ``path`` may be a run's output directory, its ``checkpoints/`` directory, or one step's directory;
    ``step`` None reads the newest complete checkpoint (or the step named by a step directory).
    """
    directory, named = _resolve(path)
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=False))
    try:
        step = step if step is not None else named if named is not None else ckpt.latest_step()
        if step is None or step not in ckpt.all_steps():
            raise FileNotFoundError(
                f"no complete checkpoint {'' if step is None else f'for step {step} '}under {directory} "
                f"(complete steps: {ckpt.all_steps()}): init_from takes a run output dir, its checkpoints/ "
                "dir, a step dir or a Hugging Face model directory"
            )
        return ckpt.restore_raw(step), ckpt.read_meta(step), step
    finally:
        ckpt.close()


def load_checkpoint(path: str) -> Model:
    """The model (config + fp32 parameters) of a training checkpoint; the newest complete one by default.

    ``path`` may be a run's output directory, its ``checkpoints/`` directory, or one step's directory.
    """
    import draccus

    from moe_trainer.config import ModelConfig
    from moe_trainer.model import Model, init_params

    directory, step = _resolve(path)
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=False))
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(
                f"no complete checkpoint under {directory}: pass a run output dir, its checkpoints/ dir or a "
                "step dir"
            )
        try:
            meta = ckpt.read_meta(step)
            model_cfg = draccus.decode(ModelConfig, meta["model_config"])
            abstract = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0)))
            params = ckpt.restore_params(step, abstract)
        except Exception as e:  # damaged files: one line naming the checkpoint, never a TensorStore dump
            raise UnreadableCheckpointError(path, step, ckpt.step_path(step), one_line(e)) from e
    finally:
        ckpt.close()
    return Model(model_cfg, params)


class UnreadableCheckpointError(RuntimeError):
    """A checkpoint that a reader (evaluation, export) was given cannot be read: damaged after it was written.

    ``input_path`` is the path the reader was given (a train step's output path, usually): the engine names
    the step whose output it is and the fix (``marin run SCRIPT --force-run STEP``,
    marin/execution/inputs.py); this library knows no engine, only that attribute. A reader never falls
    back to an older checkpoint by itself: that would evaluate other weights than the ones asked for.
    """

    def __init__(self, input_path: str, step: int, path: str, error: str) -> None:
        self.input_path, self.step, self.path, self.error = input_path, step, path, error
        super().__init__(
            f"checkpoint step {step} at {path} cannot be read ({error}): it was damaged after the run that "
            "wrote it finished; re-run that run so it writes the checkpoint again (it falls back to its "
            "newest readable checkpoint and trains from there)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickles with its fields (the engine gets it from a worker)
        return type(self), (self.input_path, self.step, self.path, self.error)
