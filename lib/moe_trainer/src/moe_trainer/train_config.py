"""The configuration of a training run: ``TrainConfig`` (parsed from a preset YAML plus command-line overrides
by draccus), its ``DataConfig`` and ``MeshConfig``, and ``TrainResult``, what ``train`` returns.

They live apart from the loop (train.py) so that what the loop stands on (compiled.py, batch_source.py,
resume.py, presets/) can read a config without importing the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moe_trainer import optim
from moe_trainer.checkpoint import CheckpointConfig
from moe_trainer.config import ModelConfig
from moe_trainer.data.mixture import MixtureConfig
from moe_trainer.distributed import DistributedConfig
from moe_trainer.evaluate import EvalConfig
from moe_trainer.health import HealthConfig
from moe_trainer.metrics import MetricsConfig
from moe_trainer.warm_start import WarmStartConfig
from moe_trainer.watch import WatchConfig


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
    start_step: int = 0
    """The step this invocation started from (0: a fresh start; ``step`` itself: a run that had already
    finished, resumed at its end, trained no step, and whose ``tokens_per_s`` is therefore 0)."""
    checkpoint_fallbacks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Damaged checkpoints this invocation skipped on resume (resume.py ``Fallback.to_json``: step, path,
    error, moved_to, resumed_from, resumed_time, steps_redone); empty when it resumed from the newest."""
