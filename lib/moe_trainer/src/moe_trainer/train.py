"""Training entry points: ``TrainConfig``, ``train(config) -> TrainResult`` and the draccus CLI.

    python -m moe_trainer.train --config tiny [--num_steps 200 --optimizer.lr 1e-3 ...]
    python -m moe_trainer.train --config path/to/preset.yaml --output_dir runs/x

``train`` builds a ``(data, expert, model)`` mesh, initialises (or restores) the train state sharded on it,
and runs the jitted step of ``step.py`` over batches that the data library's ``TrainLoader`` computes from the
step index alone, so a run resumes exactly: on start it restores the newest *complete* checkpoint under
``{output_dir}/checkpoints`` (parameters, optimizer state, step, data position, RNG, health windows) and
continues; metrics.jsonl is cut back to that step. The loop overlaps host and device by reading step t's
metrics after step t+1 has been dispatched (except at checkpoint and evaluation steps, whose rows are written
before the checkpoint so that a resumed run never lacks them).

Multi-host (docs/trainer.md): with the gang's MARIN_GANG_* variables set, ``train`` joins ``jax.distributed``
first (``distributed.py``), builds the mesh over every process's devices, has each process read only its rows
of every global batch, and writes metrics, W&B and eval.json from process 0 only; checkpoints are written and
restored by all processes together.

Progress: with ``progress_file`` set, process 0 reports the last completed step, the newest complete
checkpoint and the resume point there (``progress.py``), every couple of seconds and at checkpoints.

Mixed precision: parameters and optimizer state are float32 (master weights); the model computes in
``model.compute_dtype`` (bfloat16 on accelerators) with float32 router, norms, logits and loss.

Reading order: the configs, ``_metrics_row`` (one metrics.jsonl row of a step), then ``train``: its loop is
the file's subject. What the loop stands on lives in modules of its own: ``compiled.py`` (the mesh, the state
shardings and the cached jitted step), ``batch_source.py`` (opening this process's batches), ``resume.py``
(the first state: checkpoint, warm start or fresh; a finished run's last row and eval.json).
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

from moe_trainer import distributed, optim
from moe_trainer.batch_source import BatchSource, open_source, progress_of, rows_of
from moe_trainer.checkpoint import CheckpointConfig, Checkpointer
from moe_trainer.compiled import (
    CPU_COMPILER_OPTIONS,
    Compiled,
    build_mesh,
    compile_train_step,
    compiler_options,
    state_shardings,
)
from moe_trainer.config import ModelConfig
from moe_trainer.data.mixture import MixtureConfig
from moe_trainer.distributed import DistributedConfig
from moe_trainer.evaluate import EvalConfig, evaluate
from moe_trainer.health import HealthConfig
from moe_trainer.metrics import MetricsConfig, MetricsWriter, peak_flops_per_device, train_flops_per_token
from moe_trainer.model import Model
from moe_trainer.progress import ProgressFile, read_progress
from moe_trainer.resume import last_train_row, read_json, restore_or_init, write_json
from moe_trainer.warm_start import WarmStartConfig
from moe_trainer.watch import WatchConfig, Watcher, facts_of

# Importable from here as before the split (tests, benchmarks and notebooks use them).
__all__ = [
    "CPU_COMPILER_OPTIONS",
    "BatchSource",
    "DataConfig",
    "MeshConfig",
    "TrainConfig",
    "TrainResult",
    "build_mesh",
    "compiler_options",
    "main",
    "parse_config",
    "state_shardings",
    "train",
]
_compile = compile_train_step  # the cached compile's name before it moved to compiled.py


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Training data and held-out validation data (token caches written by the tokenize step)."""

    train_cache: str = ""
    """Path (local or gs://...) of the training token cache (or use `mixture` for several weighted caches)."""
    mixture: MixtureConfig = dataclasses.field(default_factory=MixtureConfig)
    """Several training caches mixed by weight, with optional stages (data/mixture.py); excludes train_cache.
    """
    validation: dict[str, str] = dataclasses.field(default_factory=dict)
    """Validation caches by domain name, e.g. {python: /data/val-python, web: gs://b/val-web}."""
    seq_len: int = 512
    """Tokens per training sequence."""
    batch_size: int = 8
    """Sequences per optimizer step (the global batch, split into accum_steps microbatches)."""
    seed: int = 0
    """Key of the Feistel data permutation (a different key per epoch is derived from it)."""
    prefetch: int = 4
    """Batches computed ahead on a background thread."""

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.batch_size < 1:
            raise ValueError(
                f"data.seq_len={self.seq_len} and data.batch_size={self.batch_size} must be >= 1"
            )
        if self.train_cache and self.mixture.enabled:
            raise ValueError(
                f"data.train_cache={self.train_cache!r} and data.mixture.sources are both set: use "
                "train_cache for one cache, or list it as one of the mixture's sources"
            )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape: data (FSDP) x expert x model axes."""

    data: int = -1
    """Data-parallel / FSDP axis size; -1 uses every device not taken by the expert and model axes."""
    expert: int = 1
    """Expert-parallel axis size."""
    model: int = 1
    """Tensor-parallel axis size."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; parsed from a preset YAML plus command-line overrides."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model architecture (see moe_trainer.config.ModelConfig)."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """Training and validation token caches, sequence length, batch size, data seed."""
    optimizer: optim.OptimizerConfig = dataclasses.field(default_factory=optim.OptimizerConfig)
    """AdamW (or Muon for matrices) with parameter groups."""
    schedule: optim.ScheduleConfig = dataclasses.field(default_factory=optim.ScheduleConfig)
    """Learning-rate schedule."""
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    """Gradient clipping, update-norm clipping, skip-bad-step."""
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    """Checkpoint directory, interval and retention."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Held-out evaluation interval and size."""
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    """metrics.jsonl, W&B and progress-bar settings."""
    watch: WatchConfig = dataclasses.field(default_factory=WatchConfig)
    """Health rules evaluated while the run trains: alerts.jsonl, watch.json (watch.py, docs/health.md)."""
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    """Device mesh shape (over the devices of every process of a multi-host run)."""
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    """Multi-host runs: timeouts of jax.distributed (the gang comes from MARIN_GANG_* variables)."""
    num_steps: int = 1000
    """Total optimizer steps of the run (the schedule spans them)."""
    accum_steps: int = 1
    """Microbatches per optimizer step (gradient accumulation); must divide data.batch_size."""
    output_dir: str = "runs/default"
    """Run directory: metrics.jsonl, wandb.json, checkpoints/, eval.json. Re-running resumes from it."""
    seed: int = 0
    """Parameter-initialisation seed (also seeds the train state's RNG key)."""
    run_steps: int | None = None
    """Stop this invocation after this many steps (a later call resumes); the schedule still spans
    num_steps."""
    matmul_precision: str = "default"
    """jax default_matmul_precision: default, high or highest (highest makes CPU fp32 runs exact)."""
    init_from: str = ""
    """Warm start (warm_start.py): a checkpoint (run dir, checkpoints/ or step dir) or a Hugging Face
    directory
    whose parameters initialise this run, mapped across architectures; used only while output_dir has no
    checkpoint of its own. Empty: a fresh initialisation."""
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    """How init_from is mapped: optimizer state reset/carry, data position, new experts, path renames."""
    progress_file: str | None = None
    """Where to report progress (last step, newest complete checkpoint, resume point; progress.py) for a
    scheduler, e.g. the engine's MARIN_PROGRESS_FILE; written by process 0. None: not written."""

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps} must be >= 1")
        if self.accum_steps < 1 or self.data.batch_size % self.accum_steps:
            raise ValueError(
                f"accum_steps={self.accum_steps} must be >= 1 and divide data.batch_size="
                f"{self.data.batch_size}"
            )
        if self.run_steps is not None and self.run_steps < 1:
            raise ValueError(f"run_steps={self.run_steps} must be >= 1 or null")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What ``train`` returns: where the outputs are and the final figures."""

    output_dir: str
    step: int
    """Optimizer steps completed (== num_steps when the run finished)."""
    loss: float
    """Training loss of the last step of this invocation."""
    metrics_path: str
    checkpoint_dir: str
    eval: dict[str, Any] | None
    """The final dropless evaluation (eval.json shape), or None without validation caches."""
    skipped_steps: int
    tokens_per_s: float
    """Median training throughput of this invocation (first step, which compiles, excluded when possible)."""


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


def train(config: TrainConfig, *, batch_source: BatchSource | None = None) -> TrainResult:
    """Train (or resume) the run described by ``config``; see the module docstring.

    ``batch_source`` replaces the token-cache loader (anything with ``batch(step) -> dict`` of numpy arrays
    shaped like the loader's global batch; in a multi-host run each process keeps its own rows); notebooks and
    tests use it. With MARIN_GANG_* set (a gang step), ``jax.distributed`` is initialised first and the mesh
    spans every process's devices (docs/trainer.md "Multi-host").
    """
    from moe_trainer.data.loader import Prefetcher

    distributed.initialize(config.distributed)
    primary = distributed.is_primary()
    mesh = build_mesh(config.mesh)
    out = config.output_dir.rstrip("/")
    ckpt_dir = config.checkpoint.dir or f"{out}/checkpoints"
    batch_shape = (config.data.batch_size, config.data.seq_len)
    with jax.default_matmul_precision(config.matmul_precision):
        comp = compile_train_step(
            config.model,
            config.optimizer,
            config.schedule,
            config.health,
            config.accum_steps,
            config.num_steps,
            config.seed,
            mesh,
            batch_shape,
        )
        ckpt = Checkpointer(ckpt_dir, config.checkpoint)
        state = restore_or_init(comp, ckpt, config)
        start = int(state["step"])
        reporter = _progress_file(config, primary, start)
        end = (
            config.num_steps if config.run_steps is None else min(config.num_steps, start + config.run_steps)
        )
        rows = distributed.process_rows(comp.batch_sharding, batch_shape)
        source = open_source(config, rows) if batch_source is None else batch_source
        fetch = source.batch if batch_source is None else rows_of(batch_source, rows)
        run_config = draccus.encode(config)
        meta = {"model_config": draccus.encode(config.model), "train_config": run_config}
        writer = MetricsWriter(
            out,
            config.metrics,
            run_config=run_config,
            total_steps=config.num_steps,
            start_step=start,
            enabled=primary,
        )
        watcher = _start_watcher(config, out, start) if primary else None
        tokens = batch_shape[0] * batch_shape[1]
        fpt = train_flops_per_token(config.model, config.data.seq_len)
        peak = config.metrics.peak_flops or peak_flops_per_device(jax.devices()[0], mesh.size)[0]
        peak_total = peak * mesh.size
        rates: list[float] = []
        last_row: dict[str, Any] | None = None
        final_eval: dict[str, Any] | None = None
        data_position = int(state["data_position"])
        batches = Prefetcher(fetch, data_position, data_position + (end - start), depth=config.data.prefetch)
        progress = progress_of(source)
        try:
            pending: tuple[int, Any] | None = None
            run_step: Callable[..., Any] | None = None
            t_prev = time.perf_counter()

            def emit(p: tuple[int, Any]) -> dict[str, Any]:
                nonlocal t_prev
                jax.block_until_ready(p[1])
                t_now = time.perf_counter()
                row = _metrics_row(p[0], p[1], config.optimizer.lr, tokens, t_now - t_prev, fpt, peak_total)
                row.update(progress(data_position + p[0] - start))
                t_prev = t_now
                rates.append(row["tokens_per_s"])
                writer.log(row)
                reporter.step_done(p[0], ckpt.saving())
                _watch(watcher, writer, row)
                return row

            for step in range(start, end):
                batch = distributed.global_batch(next(batches), comp.batch_sharding, batch_shape)
                run_step = run_step or _step_executable(comp, state, batch, config.distributed)
                state, m = run_step(state, batch)
                if pending is not None:
                    last_row = emit(pending)
                pending = (step + 1, m)  # rows are numbered by completed steps: row k = after k updates
                done = step + 1
                checkpoint_now = done % config.checkpoint.every_steps == 0 or done == config.num_steps
                evaluate_now = bool(config.data.validation) and (
                    done == config.num_steps
                    or (config.eval.every_steps and done % config.eval.every_steps == 0)
                )
                if checkpoint_now or evaluate_now:
                    # a step's rows (and eval.json) are written before its checkpoint: a run killed right
                    # after the checkpoint and resumed from it never lacks them
                    last_row = emit(pending)
                    pending = None
                if evaluate_now:
                    evals = _evaluate(config, state["params"], mesh)
                    writer.log({"step": done, **evals, "time": time.time()})
                    _watch(watcher, writer, {"step": done, **evals})
                    final_eval = evals["eval"]
                    if done == config.num_steps and primary:
                        write_json(f"{out}/eval.json", final_eval)
                    t_prev = time.perf_counter()
                if checkpoint_now:
                    writer.flush()
                    ckpt.save(done, state, {**meta, "step": done, "time": time.time()})
                    reporter.checkpoint_started(done)
            if pending is not None:
                last_row = emit(pending)
            if end > start and end % config.checkpoint.every_steps and end != config.num_steps:
                # an invocation cut short by run_steps leaves a checkpoint where the next one resumes
                writer.flush()
                ckpt.save(end, state, {**meta, "step": end, "time": time.time()})
                reporter.checkpoint_started(end)
        finally:
            batches.close()
            _close_watcher(watcher, writer)
            writer.close()
            ckpt.close()
            reporter.close()
    if last_row is None and start >= config.num_steps:  # the run had already finished: report its end
        last_row = last_train_row(f"{out}/metrics.jsonl")
        final_eval = read_json(f"{out}/eval.json")
    steady = rates[1:] if len(rates) > 1 else rates
    return TrainResult(
        output_dir=out,
        step=int(state["step"]),
        loss=float(last_row["loss"]) if last_row else float("nan"),
        metrics_path=f"{out}/metrics.jsonl",
        checkpoint_dir=ckpt_dir,
        eval=final_eval,
        skipped_steps=int(state["health"]["skipped_total"]),
        tokens_per_s=float(np.median(steady)) if steady else 0.0,
    )


def _progress_file(config: TrainConfig, primary: bool, start: int) -> ProgressFile:
    """This invocation's progress reporter (progress.py): process 0 writes ``config.progress_file``."""
    path = config.progress_file if primary else None
    return ProgressFile(path, start_step=start, previous=read_progress(path) if start else None)


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
    compiled = jitted.lower(state, batch).compile()
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
