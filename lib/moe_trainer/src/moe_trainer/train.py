"""Training entry points: ``train(config) -> TrainResult`` and the draccus CLI (``main``, ``parse_config``).

    python -m moe_trainer.train --config tiny [--num_steps 200 --optimizer.lr 1e-3 ...]
    python -m moe_trainer.train --config path/to/preset.yaml --output_dir runs/x

``train`` builds a ``(data, expert, model)`` mesh, initialises (or restores) the train state sharded on it,
and runs the jitted step of ``step.py`` over batches that the data library's ``TrainLoader`` computes from the
step index alone, so a run resumes exactly: on start it restores the newest *complete* checkpoint under
``{output_dir}/checkpoints`` (parameters, optimizer state, step, data position, RNG, health windows) and
continues; metrics.jsonl is cut back to that step. A checkpoint damaged on storage is reported in one line,
moved aside and skipped for the next older one (``resume.py``). The loop overlaps host and device by reading
step t's metrics after step t+1 has been dispatched (except at checkpoint and evaluation steps, whose rows are
written before the checkpoint so that a resumed run never lacks them).

Multi-host (docs/trainer.md): with the gang's MARIN_GANG_* variables set, ``train`` joins ``jax.distributed``
first (``distributed.py``), builds the mesh over every process's devices, has each process read only its rows
of every global batch, and writes metrics, W&B and eval.json from process 0 only; checkpoints are written and
restored by all processes together.

Progress: with ``progress_file`` set, process 0 reports the last completed step, the newest complete
checkpoint and the resume point there (``progress.py``), every couple of seconds and at checkpoints.

Mixed precision: parameters and optimizer state are float32 (master weights); the model computes in
``model.compute_dtype`` (bfloat16 on accelerators) with float32 router, norms, logits and loss.

Reading order: ``train`` (setup, run, finish), then ``_open`` (the setup: everything an invocation holds
open, an ``_Invocation``), ``_run`` (the loop: the file's subject), ``_finish`` (the ``TrainResult``), and
``_Rows`` (one metrics.jsonl row per step, timed). What the loop stands on lives in modules of its own:
``train_config.py`` (``TrainConfig`` and its parts), ``state.py`` (``TrainState``), ``compiled.py`` (the
mesh, the state shardings and the cached jitted step), ``batch_source.py`` (opening this process's batches),
``resume.py`` (the first state: checkpoint, warm start or fresh; a finished run's last row and eval.json).
"""


from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import draccus
import jax
import numpy as np
from jax.sharding import Mesh

from moe_trainer import distributed
from moe_trainer.batch_source import BatchSource, open_source, progress_of, rows_of
from moe_trainer.checkpoint import Checkpointer
from moe_trainer.compiled import Compiled, StepSpec, build_mesh, compile_train_step
from moe_trainer.data.loader import Prefetcher
from moe_trainer.distributed import DistributedConfig
from moe_trainer.evaluate import evaluate
from moe_trainer.jax_typed import block_until_ready
from moe_trainer.jsonio import read_json, write_json_atomic
from moe_trainer.metrics import MetricsWriter, peak_flops_per_device, train_flops_per_token
from moe_trainer.model import Model
from moe_trainer.progress import ProgressFile, read_progress
from moe_trainer.resume import Fallback, Start, last_train_row, restore_or_init
from moe_trainer.state import TrainState
from moe_trainer.train_config import TrainConfig, TrainResult
from moe_trainer.watch import Watcher, facts_of

__all__ = ["main", "parse_config", "train"]


def train(config: TrainConfig, *, batch_source: BatchSource | None = None) -> TrainResult:
    """Train (or resume) the run described by ``config``; see the module docstring.

    ``batch_source`` replaces the token-cache loader (anything with ``batch(step) -> dict`` of numpy arrays
    shaped like the loader's global batch; in a multi-host run each process keeps its own rows); notebooks and
    tests use it. With MARIN_GANG_* set (a gang step), ``jax.distributed`` is initialised first and the mesh
    spans every process's devices (docs/trainer.md "Multi-host").
    """
    distributed.initialize(config.distributed)
    with jax.default_matmul_precision(config.matmul_precision):
        run, state = _open(config, batch_source)
        try:
            state = _run(run, state)
        finally:
            run.close()
    return _finish(run, state)


@dataclasses.dataclass
class _Invocation:
    """What one call of ``train`` holds open, from the setup (``_open``) to ``close``."""

    config: TrainConfig
    mesh: Mesh
    comp: Compiled
    ckpt: Checkpointer
    reporter: ProgressFile
    writer: MetricsWriter
    watcher: Watcher | None
    batches: Prefetcher
    rows: _Rows
    start: int
    """The step this invocation starts from (restored, or 0)."""
    end: int
    """The step it stops at: num_steps, or sooner with run_steps."""
    meta: dict[str, Any]
    """The JSON saved beside every checkpoint (model and train configs)."""
    final_eval: dict[str, Any] | None = None
    """The newest dropless evaluation of this invocation."""
    fallbacks: tuple[Fallback, ...] = ()
    """Damaged checkpoints skipped on the way to the one this invocation resumed from."""

    @property
    def out(self) -> str:
        return self.config.output_dir.rstrip("/")

    def close(self) -> None:
        self.batches.close()
        _close_watcher(self.watcher, self.writer)
        self.writer.close()
        self.ckpt.close()
        self.reporter.close()


def _open(config: TrainConfig, batch_source: BatchSource | None) -> tuple[_Invocation, TrainState]:
    """The setup: mesh, compiled step, first state (restored, warm-started or fresh), writers and batches."""
    primary = distributed.is_primary()
    mesh = build_mesh(config.mesh)
    out = config.output_dir.rstrip("/")
    comp = compile_train_step(StepSpec.of(config), mesh)
    ckpt = Checkpointer(config.checkpoint.dir or f"{out}/checkpoints", config.checkpoint)
    first = restore_or_init(comp, ckpt, config)
    state, start = first.state, int(first.state.step)
    end = config.num_steps if config.run_steps is None else min(config.num_steps, start + config.run_steps)
    batch_shape = (config.data.batch_size, config.data.seq_len)
    rows = distributed.process_rows(comp.batch_sharding, batch_shape)
    source = open_source(config, rows) if batch_source is None else batch_source
    fetch = source.batch if batch_source is None else rows_of(batch_source, rows)
    run_config = draccus.encode(config)
    writer = MetricsWriter(out, config.metrics, run_config=run_config, total_steps=config.num_steps,
                           start_step=start, enabled=primary)
    data_position = int(state.data_position)
    run = _Invocation(
        config=config, mesh=mesh, comp=comp, ckpt=ckpt, reporter=_progress_file(config, primary, first),
        writer=writer, watcher=_start_watcher(config, out, start) if primary else None,
        batches=Prefetcher(fetch, data_position, data_position + (end - start), depth=config.data.prefetch),
        rows=_Rows(config, mesh, progress_of(source), data_position - start),
        start=start, end=end,
        meta={"model_config": draccus.encode(config.model), "train_config": run_config},
        fallbacks=first.fallbacks,
    )
    return run, state


def _run(run: _Invocation, state: TrainState) -> TrainState:
    """The loop: steps ``start`` to ``end``, their rows, evaluations and checkpoints; the last state.

    Host and device overlap: step t's metrics are read (``_Rows.emit``) after step t+1 has been dispatched,
    except where a step is evaluated or checkpointed: its row is written first, so that a run killed right
    after the checkpoint and resumed from it never lacks it.
    """
    config, comp = run.config, run.comp
    batch_shape = (config.data.batch_size, config.data.seq_len)
    pending: tuple[int, Any] | None = None  # (completed steps, metrics): row k is the one after k updates
    run_step: Callable[..., Any] | None = None
    for step in range(run.start, run.end):
        batch = distributed.global_batch(next(run.batches), comp.batch_sharding, batch_shape)
        run_step = run_step or _step_executable(comp, state, batch, config.distributed)
        state, metrics = run_step(state, batch)
        if pending is not None:
            _emit(run, *pending)
        done = step + 1
        pending = (done, metrics)
        # the end of an invocation cut short by run_steps is checkpointed too: the next one resumes there
        checkpoint_now = done % config.checkpoint.every_steps == 0 or done in (config.num_steps, run.end)
        evaluate_now = bool(config.data.validation) and (
            done == config.num_steps or bool(config.eval.every_steps and done % config.eval.every_steps == 0)
        )
        if checkpoint_now or evaluate_now:
            _emit(run, *pending)
            pending = None
        if evaluate_now:
            _evaluate_step(run, done, state)
        if checkpoint_now:
            run.writer.flush()
            run.ckpt.save(done, state, {**run.meta, "step": done, "time": time.time()})
            run.reporter.checkpoint_started(done)
    if pending is not None:
        _emit(run, *pending)
    return state


def _emit(run: _Invocation, step: int, metrics: Any) -> None:
    """Write the row of ``step`` (its device ``metrics`` read back) and tell the progress file and the
    watcher."""
    row = run.rows.emit(step, metrics)
    run.writer.log(row)
    run.reporter.step_done(step, run.ckpt.saving())
    _watch(run.watcher, run.writer, row)


def _evaluate_step(run: _Invocation, done: int, state: TrainState) -> None:
    """Evaluate the parameters after ``done`` steps; the final evaluation also goes to eval.json."""
    evals = _evaluate(run.config, state.params, run.mesh)
    run.writer.log({"step": done, **evals, "time": time.time()})
    _watch(run.watcher, run.writer, {"step": done, **evals})
    run.final_eval = evals["eval"]
    if done == run.config.num_steps and distributed.is_primary():
        write_json_atomic(f"{run.out}/eval.json", run.final_eval)
    run.rows.restart_clock()  # the evaluation's time is not the next step's


def _finish(run: _Invocation, state: TrainState) -> TrainResult:
    """The ``TrainResult`` of an invocation; for a run that had already finished, its recorded end."""
    last_row, final_eval = run.rows.last, run.final_eval
    if last_row is None and run.start >= run.config.num_steps:
        last_row = last_train_row(f"{run.out}/metrics.jsonl")
        final_eval = read_json(f"{run.out}/eval.json")
    steady = run.rows.rates[1:] if len(run.rows.rates) > 1 else run.rows.rates
    return TrainResult(
        output_dir=run.out,
        step=int(state.step),
        loss=float(last_row["loss"]) if last_row else float("nan"),
        metrics_path=f"{run.out}/metrics.jsonl",
        checkpoint_dir=run.ckpt.directory,
        eval=final_eval,
        skipped_steps=int(state.health["skipped_total"]),
        tokens_per_s=float(np.median(steady)) if steady else 0.0,
        start_step=run.start,
        checkpoint_fallbacks=[f.to_json() for f in run.fallbacks],
    )


class _Rows:
    """The metrics.jsonl rows of the training steps, each timed from the previous row (or clock restart)."""

    def __init__(self, config: TrainConfig, mesh: Mesh, progress: Callable[[int], dict[str, float]],
                 position_offset: int) -> None:
        self.lr_peak = config.optimizer.lr
        self.tokens = config.data.batch_size * config.data.seq_len
        self.flops_per_token = train_flops_per_token(config.model, config.data.seq_len)
        peak = config.metrics.peak_flops or peak_flops_per_device(jax.devices()[0], mesh.size)[0]
        self.peak_total = peak * mesh.size
        self.progress = progress
        self.position_offset = position_offset
        """data position - step: a warm start that carried its data position reads ahead of its steps."""
        self.rates: list[float] = []
        self.last: dict[str, Any] | None = None
        self.restart_clock()

    def restart_clock(self) -> None:
        self.t_prev = time.perf_counter()

    def emit(self, step: int, metrics: Any) -> dict[str, Any]:
        """The row after ``step`` updates, once its ``metrics`` are ready on the device."""
        block_until_ready(metrics)
        t_now = time.perf_counter()
        row = _metrics_row(step, metrics, self.lr_peak, self.tokens, t_now - self.t_prev,
                           self.flops_per_token, self.peak_total)
        row.update(self.progress(self.position_offset + step))
        self.t_prev = t_now
        self.rates.append(row["tokens_per_s"])
        self.last = row
        return row


def _metrics_row(
    step: int,
    m: dict[str, Any],
    lr_peak: float,
    tokens: int,
    dt: float | None,
    flops_per_token: float,
    peak_total: float,
) -> dict[str, Any]:
    m = jax.device_get(m)
    tok_count = max(float(m.get("tokens", tokens)), 1.0)
    tps = tokens / dt if dt else 0.0
    row = {
        "step": step,
        "loss": float(m["loss"]),
        "ce_loss": float(m["ce_sum"]) / tok_count if "ce_sum" in m else float(m["loss"]),
        "lr": lr_peak * float(m["lr_factor"]),
        "grad_norm": float(m["grad_norm"]),
        "update_norm": float(m["update_norm"]),
        "skipped": bool(m["skipped"]),
        "clipped": bool(m["grad_clipped"] or m["update_clipped"]),
        "grad_clipped": bool(m["grad_clipped"]),
        "update_clipped": bool(m["update_clipped"]),
        "nonfinite": bool(m["nonfinite"]),
        "loss_spike": bool(m["loss_spike"]),
        "grad_spike": bool(m["grad_spike"]),
        "tokens_per_s": tps,
        "mfu": tps * flops_per_token / peak_total if peak_total else 0.0,
        "aux_loss": float(m.get("aux_loss", 0.0)),
        "router_z_loss": float(m.get("router_z_loss", 0.0)),
        "logit_z_loss": float(m.get("logit_z_sum", 0.0)) / tok_count,
        "drop_rate": float(m.get("dropped", 0)) / max(float(m.get("assignments", 0)), 1.0),
        "expert_load": np.asarray(m.get("expert_load", np.zeros((0, 0)))).tolist(),
        "routing_entropy": np.asarray(m.get("routing_entropy", np.zeros((0,)))).tolist(),
        "skipped_total": int(m.get("skipped_total", 0)),
        "update_filter_armed": bool(m["update_filter_armed"]) if "update_filter_armed" in m else None,
        "load_imbalance": _load_imbalance(m.get("expert_load")),
        "time": time.time(),
    }
    return row


def _load_imbalance(expert_load: Any) -> float:
    """max/mean expert load of the most unbalanced MoE layer (1.0 balanced; 0.0 without MoE layers)."""
    load = np.asarray(expert_load if expert_load is not None else np.zeros((0, 0)), np.float64)
    if load.ndim != 2 or load.size == 0:
        return 0.0
    mean = load.mean(axis=1)
    return float(np.max(np.where(mean > 0, load.max(axis=1) / np.maximum(mean, 1e-30), 0.0)))


def _progress_file(config: TrainConfig, primary: bool, first: Start) -> ProgressFile:
    """This invocation's progress reporter (progress.py): process 0 writes ``config.progress_file``."""
    path, start = (config.progress_file if primary else None), int(first.state.step)
    return ProgressFile(path, start_step=start, previous=read_progress(path) if start else None,
                        restored_time=first.restored_time, fallbacks=[f.to_json() for f in first.fallbacks])


def _start_watcher(config: TrainConfig, out: str, start: int) -> Watcher | None:
    """The health watcher of this attempt (process 0 only), or None when ``watch.enabled`` is off."""
    return Watcher(config.watch, out, facts_of(config), start_step=start).start() if config.watch.enabled \
        else None


def _watch(watcher: Watcher | None, writer: MetricsWriter, row: dict[str, Any]) -> None:
    """Evaluate the health rules on a row; the alert events they raised go into metrics.jsonl too."""
    if watcher is None:
        return
    watcher.observe(row)
    for event_row in watcher.drain():
        writer.log(event_row)


def _close_watcher(watcher: Watcher | None, writer: MetricsWriter) -> None:
    if watcher is None:
        return
    failure = sys.exc_info()[1]
    reason = "the attempt ended" if failure is None else f"the attempt failed ({type(failure).__name__})"
    watcher.close(reason)
    for event_row in watcher.drain():
        writer.log(event_row)


def _step_executable(comp: Compiled, state: Any, batch: Any, cfg: DistributedConfig) -> Callable[..., Any]:
    """The train step to call: the cached jit on one process; on several, compiled ahead of time and started
    only once every process has compiled it (see ``distributed.barrier``)."""
    if jax.process_count() == 1:
        return comp.step
    jitted: Any = comp.step  # a jax.jit function (typed as a plain callable in _Compiled)
    compiled: Callable[..., Any] = jitted.lower(state, batch).compile()
    distributed.barrier("train_step_compiled", distributed.init_timeout_s(cfg))
    return compiled


def _evaluate(config: TrainConfig, params: Any, mesh: Mesh) -> dict[str, Any]:
    """Dropless evaluation (always) and, for a capacity-limited model, the capacity-limited one too."""
    model = Model(config.model, params)

    def run(capacity_factor: float | None | Literal["config"]) -> dict[str, Any]:
        return evaluate(
            model,
            config.data.validation,
            seq_len=config.data.seq_len,
            batch_size=config.eval.batch_size,
            max_batches=config.eval.max_batches,
            capacity_factor=capacity_factor,
            mesh=mesh,
        )

    out = {"eval": run(None)}
    if config.model.capacity_factor is not None:
        out["eval_capacity"] = run("config")
    return out


def parse_config(argv: list[str]) -> TrainConfig:
    """Parse ``--config <preset name or yaml> [--field.sub value ...]`` into a TrainConfig."""
    from moe_trainer.presets import preset_path

    args = list(argv)
    config_path = None
    for flag in ("--config", "--config_path"):
        if flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                raise ValueError(f"{flag} needs a preset name or a YAML path")
            config_path = args[i + 1]
            del args[i : i + 2]
    if config_path is not None and not os.path.exists(config_path):
        config_path = preset_path(config_path)
    return draccus.parse(TrainConfig, config_path=config_path, args=args)


def main(argv: list[str] | None = None) -> TrainResult:
    config = parse_config(sys.argv[1:] if argv is None else argv)
    result = train(config)
    print(json.dumps(dataclasses.asdict(result), default=str))
    return result


if __name__ == "__main__":
    main()
