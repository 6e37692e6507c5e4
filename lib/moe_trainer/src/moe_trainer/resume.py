"""Where a run starts, and what a finished run reports: the run directory read back.

``restore_or_init`` gives ``train`` its first state: the newest *complete* checkpoint restored onto this
configuration's shardings (a mismatch with the checkpoint is an error naming the fix), else a warm start from
``config.init_from`` (warm_start.py), else a fresh initialisation. When a run had already finished, ``train``
reports its end from the files it wrote: the last training row of metrics.jsonl and eval.json.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import jax

from moe_trainer.checkpoint import Checkpointer
from moe_trainer.compiled import Compiled
from moe_trainer.jax_typed import shape_dtype_struct
from moe_trainer.state import TrainState
from moe_trainer.train_config import TrainConfig


def restore_or_init(comp: Compiled, ckpt: Checkpointer, config: TrainConfig) -> TrainState:
    """The newest complete checkpoint restored onto this run's shardings, or a fresh (or warm-started) state.
    """
    latest = ckpt.latest_step()
    if latest is None and config.init_from:
        from moe_trainer.warm_start import warm_state, write_report

        state, report = warm_state(
            comp.init(), comp.shardings, config.model, config.init_from, config.warm_start, config.seed
        )
        print(write_report(report, config.output_dir), file=sys.stderr, flush=True)
        return state
    if latest is None:
        return comp.init()
    abstract = jax.tree.map(
        lambda a, s: shape_dtype_struct(a.shape, a.dtype, sharding=s), comp.abstract_state, comp.shardings
    )
    try:
        restored: TrainState = ckpt.restore(latest, abstract)[0]  # a TrainState, as ``abstract`` is one
        return restored
    except (ValueError, KeyError) as e:
        raise ValueError(
            f"cannot resume from checkpoint step {latest} in {ckpt.directory}: its train state does not "
            "match "
            "this config's model/optimizer/health settings. Use a new output_dir (or checkpoint.dir) for a "
            "changed configuration, or restore the original settings"
        ) from e


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


