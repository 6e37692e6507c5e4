"""train: a thin adapter from a step config to the trainer library's ``moe_trainer.train.train``.

Outputs under ``output_path`` (the trainer's run directory, docs/formats.md "Trainer outputs")::

    checkpoints/{step}/        # orbax checkpoints (parameters, optimizer state, data position, RNG)
    metrics.jsonl              # one row per optimizer step (+ eval rows when validation caches are given)
    wandb.json                 # the W&B run reference (offline by default: nothing leaves the machine)
    train_config.json          # the full resolved trainer config (preset + overrides), for readers of the run
    train_result.json          # final step, loss, throughput, skipped steps, flops_per_token (marin compare's
                               # FLOPs axis: moe_trainer.metrics.train_flops_per_token; for runs recorded
                               # before, TrainConfig.flops_per_token_from_config derives it)
    alerts.jsonl, watch.json   # health alerts and the watcher's heartbeat (docs/health.md)

The model and optimizer come from a trainer preset (``preset``: a name such as ``tiny`` or a YAML path), then
``model`` (ModelConfig fields, or a whole ``ModelConfig``), then ``overrides`` (any other trainer field by
dotted path, e.g. ``{"optimizer.lr": 1e-3, "schedule.warmup_steps": 10}``), then the explicit fields of this
config (steps, batch, sequence length, seeds). Unknown fields are errors that list the valid ones. The health
rules are trainer fields too: ``overrides={"watch.drop_rate.max_rate": 0.05, "watch.risk_points": (...)}``
(docs/health.md), so they are part of the step's identity.

Mixtures: with ``mixture`` weights (and optionally ``mixture_stages``) the step trains on several caches,
source ``s`` being ``{train_cache}/{s}`` (the per-domain caches of a tokenize step with
``train_by_domain=True``) unless ``train_sources`` names its cache; the trainer draws each batch's rows by
weight (moe_trainer.data.mixture) and records ``tokens/{source}`` in metrics.jsonl.

Warm start: ``init_from`` (another train step's output path, ``output_path_of(step)``, or a Hugging Face
directory) initialises the model from those weights mapped onto this step's architecture
(moe_trainer.warm_start: same path and shape copied, QK-norm gains one, new experts copied, router biases
zero, dropped ones listed in ``warm_start.json``); ``warm_start`` says whether the optimizer state and the
data position carry over. Both are identity fields, and a dependency on the source step.

Resume: the trainer restores the newest complete checkpoint under ``output_path/checkpoints``. A step re-run
by the executor after a failure or a preemption has the same output path, so it continues where the last
attempt's checkpoint left it instead of starting over, and its batches are exactly those an uninterrupted run
would have seen (the Feistel data order is a function of the step index alone). A checkpoint damaged on
storage after it was written is skipped for the next older one (reported in the step's log, recorded in
``checkpoint_fallbacks`` of ``train_result.json``; docs/trainer.md), which is how ``marin run SCRIPT
--force-run TRAIN_STEP`` repairs a run whose final checkpoint an evaluation could not read. A re-run of a run
that had finished resumes at its end and trains no step: its ``train_result.json`` then carries the earlier
attempt's ``tokens_per_s`` and ``wall_s`` with a ``carried`` note (never 0 tokens/s), ``steps_trained`` is 0,
and the engine keeps the earlier file in ``.marin/earlier-{N}/`` (docs/formats.md).

Multi-host. Run as a gang step (the engine sets MARIN_GANG_SIZE/RANK and MARIN_COORDINATOR on every member),
the function runs on every host; the trainer joins the members with ``jax.distributed`` and trains on a mesh
of all their devices (docs/trainer.md "Multi-host"). Only rank 0 writes ``train_config.json``,
``train_result.json``, metrics and W&B; every member returns the same summary.

Progress. When the engine sets ``MARIN_PROGRESS_FILE`` (``{output_path}/.marin/progress.json``), the trainer
reports its last step, newest complete checkpoint and resume point there (``moe_trainer.progress``), which
the interruption ledger uses for the checkpoint, the steps redone and the time lost of an interruption.

Runtime fields. Knobs that cannot change results (checkpoint interval, W&B mode, progress bar) are marked
with the dataclass field metadata ``{"marin.runtime": True}``, which the executor reads to leave them out of
the step's identity (it is how ``marin.runtime_field`` works); operators never import ``marin``, so they
declare it with ``runtime_field`` below. Everything else changes the step's output path when edited.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import draccus

from moe_trainer import distributed
from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import TokenCache
from moe_trainer.data.mixture import MixtureConfig, MixtureStage
from moe_trainer.jsonio import JsonFileError, read_json, write_json_atomic
from moe_trainer.metrics import train_flops_per_token
from moe_trainer.presets import load_preset, preset_path
from moe_trainer.train import train as run_trainer
from moe_trainer.train_config import TrainConfig as TrainerConfig
from moe_trainer.train_config import TrainResult
from moe_trainer.warm_start import WarmStartConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Config = TypeVar("_Config", bound="DataclassInstance")
"""A config dataclass :func:`_apply` changes (it returns the same type)."""

RUNTIME_FIELD_KEY = "marin.runtime"  # the executor's convention (marin/definition/placeholders.py)


def runtime_field(*, default: Any) -> Any:
    """A config field that is passed to the function but left out of the step's identity."""
    return dataclasses.field(default=default, metadata={RUNTIME_FIELD_KEY: True})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    output_path: str
    """The run directory: checkpoints/, metrics.jsonl, wandb.json (the step's own output path)."""
    train_cache: str
    """The training token cache (the tokenize step's ``train/``); with ``mixture``, the directory holding one
    cache per source (``train/`` of a tokenize step with ``train_by_domain=True``)."""
    validation: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Validation caches by domain for evaluation during training (optional; the evaluate step does the full
    per-domain evaluation of the final checkpoint)."""
    preset: str = "tiny"
    """A trainer preset name (moe_trainer.presets) or the path of a preset YAML."""
    model: ModelConfig | Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """A whole ModelConfig replacing the preset's, or ModelConfig fields to change, e.g. {"n_layers": 2}."""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Other trainer fields by dotted path, e.g. {"optimizer.lr": 0.001, "schedule.warmup_steps": 10}."""
    mixture: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Train on several sources by weight, e.g. {"python": 0.8, "prose": 0.2} (normalised); source s reads the
    cache ``{train_cache}/{s}`` or ``train_sources[s]``. Empty: train on ``train_cache`` alone."""
    mixture_stages: tuple[MixtureStage, ...] = ()
    """Weights from a later step on, e.g. (MixtureStage(500, {"python": 0.5, "prose": 0.5}),) for a cooldown.
    """
    train_sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Caches of mixture sources that do not live under ``train_cache`` (another tokenize step's ``train/``).
    """
    init_from: str | None = None
    """Warm-start from this checkpoint (a train step's output path) or Hugging Face directory, mapped onto
    this
    step's architecture (None: a fresh initialisation)."""
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    """How ``init_from`` is mapped: optimizer state and data position reset or carried, new experts, renames.
    """
    num_steps: int | None = None
    """Optimizer steps (None: the preset's)."""
    batch_size: int | None = None
    """Sequences per optimizer step (None: the preset's)."""
    seq_len: int | None = None
    """Tokens per sequence (None: the preset's); also becomes the model's max_seq_len, the context length the
    evaluate step uses by default."""
    seed: int = 0
    """Parameter-initialisation seed."""
    data_seed: int = 0
    """Key of the Feistel permutation that orders the training sequences."""
    eval_every: int = 0
    """Evaluate on ``validation`` every this many steps (0: only at the end, when ``validation`` is given)."""
    eval_max_batches: int | None = None
    """Batches per domain for evaluations during training (None: the whole caches)."""
    checkpoint_every: int | None = runtime_field(default=None)
    """Checkpoint interval in steps (None: the preset's); the last step is always saved."""
    wandb_mode: str = runtime_field(default="offline")
    """W&B mode: offline (files only), online, or disabled."""
    progress_bar: bool = runtime_field(default=True)
    """Show the trainer's progress bar (in the step's log)."""

    # The numbers a run's summary shows for this step (marin/status/results.py). No RESULT_METRICS: the
    # rows of metrics.jsonl carry data-dependent keys, so criteria on them are checked when judged.
    HEADLINE_METRICS: ClassVar[tuple[str, ...]] = ("train_result.json/loss", "train_result.json/step",
                                                   "train_result.json/tokens_per_s")

    @staticmethod
    def flops_per_token_from_config(train_config: Mapping[str, Any]) -> float:
        """FLOPs per training token of a run recorded before train_result.json carried `flops_per_token`,
        from its train_config.json (the model and sequence length it ran with), by the function the step
        logs them with today (`train_flops_per_token`), for the compare view's FLOPs axis
        (marin/compare/flops.py)."""
        model = draccus.decode(ModelConfig, train_config["model"])
        return train_flops_per_token(model, int(train_config["data"]["seq_len"]))

    def check(self) -> None:
        """Parse what the run would parse (preset, `model`, `overrides`), without reading any data: `marin
        plan` and the start of every run call it, so a typo in a field name fails before anything runs."""
        trainer_config(self)

    def __post_init__(self) -> None:
        for name in ("num_steps", "batch_size", "seq_len", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(
                    f"train: {name}={value} must be >= 1 or None (None keeps the preset's value)"
                )
        if self.eval_every < 0:
            raise ValueError(f"train: eval_every={self.eval_every} must be >= 0")
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(f"train: wandb_mode={self.wandb_mode!r} must be offline, online or disabled")
        if (self.mixture_stages or self.train_sources) and not self.mixture:
            raise ValueError(
                "train: mixture_stages/train_sources need `mixture` weights for step 0, e.g. "
                "mixture={'python': 0.8, 'prose': 0.2}"
            )


def _apply(obj: _Config, changes: Mapping[str, Any], where: str, prefix: str = "") -> _Config:
    """``obj`` with the dataclass fields named by dotted paths (``a.b.c``) set; unknown names are errors.

    All the changes to one dataclass are made in one ``dataclasses.replace``, so fields validated together
    (``n_heads`` and ``n_kv_heads``) are never checked half-changed."""
    fields = {f.name for f in dataclasses.fields(obj)}
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in changes.items():
        head, _, rest = dotted.partition(".")
        if head not in fields:
            close = difflib.get_close_matches(head, sorted(fields), n=1)
            hint = f"did you mean {prefix + close[0]!r}? " if close else ""
            raise ValueError(
                f"train: {where} names {prefix + dotted!r}, but {type(obj).__name__} has no "
                "field "
                f"{head!r}; {hint}valid fields: {', '.join(sorted(fields))}"
            )
        if rest:
            nested.setdefault(head, {})[rest] = value
        elif isinstance(getattr(obj, head), tuple) and isinstance(value, list):
            direct[head] = tuple(value)
        else:
            direct[head] = value
    for head, sub in nested.items():
        inner = direct.get(head, getattr(obj, head))
        if not dataclasses.is_dataclass(inner) or isinstance(inner, type):
            raise ValueError(
                f"train: {where} names {prefix + head}.{next(iter(sub))!r}, but "
                f"{type(obj).__name__}.{head} is a {type(inner).__name__}, not a config with "
                "fields"
            )
        direct[head] = _apply(inner, sub, where, f"{prefix}{head}.")
    return dataclasses.replace(obj, **direct) if direct else obj


def _base(config: TrainConfig) -> TrainerConfig:
    mtime = os.path.getmtime(config.preset) if os.path.exists(config.preset) else None
    return _parsed_preset(config.preset, mtime)


@functools.lru_cache(maxsize=32)
def _parsed_preset(preset: str, mtime: float | None) -> TrainerConfig:
    """The preset's trainer config, parsed once per process (a YAML file again when its mtime changes):
    `marin plan` checks every train step of a ladder, and draccus takes tens of ms per parse. The config is
    a frozen dataclass; callers derive new ones with `dataclasses.replace`."""
    if mtime is not None:
        return draccus.parse(TrainerConfig, config_path=preset, args=[])
    preset_path(preset)  # raises ValueError listing the valid preset names
    return load_preset(preset)


def trainer_config(config: TrainConfig) -> TrainerConfig:
    """The full trainer config of this step: preset, then model, overrides and the explicit fields."""
    tc = _base(config)
    if isinstance(config.model, ModelConfig):
        tc = dataclasses.replace(tc, model=config.model)
    else:
        tc = _apply(tc, {f"model.{key}": value for key, value in config.model.items()}, "model")
    tc = _apply(tc, config.overrides, "overrides")
    data = dataclasses.replace(
        tc.data,
        train_cache="" if config.mixture else config.train_cache,
        mixture=_mixture(config),
        validation=dict(config.validation),
        seed=config.data_seed,
        batch_size=config.batch_size or tc.data.batch_size,
        seq_len=config.seq_len or tc.data.seq_len,
    )
    model = tc.model
    if config.seq_len is not None or data.seq_len > model.max_seq_len:
        # the context the model is trained at; the evaluate step reads windows of this length by default
        model = dataclasses.replace(model, max_seq_len=data.seq_len)
    return dataclasses.replace(
        tc,
        model=model,
        data=data,
        num_steps=config.num_steps or tc.num_steps,
        seed=config.seed,
        output_dir=config.output_path.rstrip("/"),
        init_from=config.init_from or tc.init_from,
        warm_start=config.warm_start if config.init_from else tc.warm_start,
        checkpoint=dataclasses.replace(
            tc.checkpoint, dir=None, every_steps=config.checkpoint_every or tc.checkpoint.every_steps
        ),
        eval=dataclasses.replace(tc.eval, every_steps=config.eval_every, max_batches=config.eval_max_batches),
        metrics=dataclasses.replace(
            tc.metrics,
            wandb_mode=config.wandb_mode,
            progress_bar=config.progress_bar,
            run_name=tc.metrics.run_name or _run_name(config.output_path),
        ),
        run_steps=None,
    )


def _mixture(config: TrainConfig) -> MixtureConfig:
    """The trainer's MixtureConfig of this step (empty without ``mixture``)."""
    if not config.mixture:
        return MixtureConfig()
    names = dict.fromkeys(
        [*config.mixture, *(n for st in config.mixture_stages for n in st.weights), *config.train_sources]
    )
    root = config.train_cache.rstrip("/")
    if not root and set(names) - set(config.train_sources):
        raise ValueError(
            f"train: train_cache is empty, so every mixture source needs a train_sources entry; "
            f"missing: {sorted(set(names) - set(config.train_sources))}"
        )
    sources = {n: config.train_sources.get(n, f"{root}/{n}") for n in names}
    return MixtureConfig(
        sources=sources,
        weights=dict(config.mixture),
        stages=tuple(MixtureStage(st.start_step, dict(st.weights)) for st in config.mixture_stages),
    )


def _run_name(output_path: str) -> str:
    parts = output_path.rstrip("/").split("/")
    return "/".join(parts[-2:])  # e.g. "train/tiny_moe-1a2b3c4d": the step name and hash


def _check_vocab(tc: TrainerConfig) -> None:
    paths = list(tc.data.mixture.sources.values()) if tc.data.mixture.enabled else [tc.data.train_cache]
    for path in paths:
        cache = TokenCache(path)
        if cache.vocab_size > tc.model.vocab_size:
            raise ValueError(
                f"train: the token cache {path} has vocab_size {cache.vocab_size} but the model has "
                f"{tc.model.vocab_size}; set model={{'vocab_size': {cache.vocab_size}}} (the tokenizer's "
                "vocabulary) in the train step's config"
            )


PROGRESS_ENV = "MARIN_PROGRESS_FILE"  # set by the engine for the attempt that keeps the step's records


def with_progress_file(tc: TrainerConfig) -> TrainerConfig:
    """The trainer config reporting progress to ``$MARIN_PROGRESS_FILE`` when the engine set it: the
    interruption ledger reads the last step, the newest complete checkpoint and the resume point from it
    (moe_trainer.progress). A runtime setting: it is not part of this step's config, so not of its identity.
    """
    path = os.environ.get(PROGRESS_ENV)
    return dataclasses.replace(tc, progress_file=path) if path else tc


def _earlier_result(out: str) -> dict[str, Any] | None:
    """The train_result.json an earlier attempt wrote in this output path (None: none, or unreadable)."""
    try:
        earlier = read_json(f"{out}/train_result.json")
    except JsonFileError:
        return None
    return earlier if isinstance(earlier, dict) else None


def _carried_figures(out: str, earlier: dict[str, Any] | None, result: TrainResult) -> dict[str, Any]:
    """The figures of a run that had finished before this attempt (it resumed at step ``result.step``, the
    end, and trained no step, so its own throughput is no figure): the earlier attempt's ``tokens_per_s``
    and ``wall_s`` carried, with a note saying so (the engine keeps that attempt's file in
    ``.marin/earlier-{N}/``); without an earlier train_result.json, the median throughput of the training
    rows of metrics.jsonl."""
    why = f"this attempt resumed at step {result.step}, the end, and trained no step"
    if earlier is not None and isinstance(earlier.get("tokens_per_s"), int | float):
        return {"tokens_per_s": earlier["tokens_per_s"], "wall_s": earlier.get("wall_s"),
                "carried": f"tokens_per_s and wall_s are the earlier attempt's ({why})"}
    rates = [r["tokens_per_s"] for r in _train_rows(f"{out}/metrics.jsonl") if "tokens_per_s" in r]
    steady = rates[1:] if len(rates) > 1 else rates
    return {"tokens_per_s": float(statistics.median(steady)) if steady else None,
            "carried": f"tokens_per_s is the median of metrics.jsonl's training rows ({why}; no earlier "
                       "train_result.json)"}


def _train_rows(path: str) -> list[dict[str, Any]]:
    """The training rows (those with a loss) of a metrics.jsonl; a line cut by a crash is skipped."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "loss" in row:
                rows.append(row)
    return rows


def train(config: TrainConfig) -> dict[str, Any]:
    """Train (or resume) the model; return the trainer's result as a dict (also written to
    train_result.json)."""
    tc = with_progress_file(trainer_config(config))
    _check_vocab(tc)
    out = config.output_path.rstrip("/")
    primary = distributed.is_primary()  # rank 0 of a gang (from MARIN_GANG_RANK), or the only process
    if primary:
        write_json_atomic(f"{out}/train_config.json", draccus.encode(tc))
    earlier = _earlier_result(out)  # read before training: rank 0 rewrites it at the end
    t0 = time.time()
    print(
        f"[train] {tc.num_steps} steps of {tc.data.batch_size} x {tc.data.seq_len} tokens, model "
        f"d_model={tc.model.d_model} layers={tc.model.n_layers} experts={tc.model.n_experts} "
        f"top_k={tc.model.top_k} vocab={tc.model.vocab_size}; output {out}",
        file=sys.stderr,
        flush=True,
    )
    result: TrainResult = run_trainer(tc)
    if result.step != tc.num_steps:
        raise RuntimeError(
            f"train: the trainer stopped at step {result.step} of {tc.num_steps} in {out}; "
            "re-run the step to resume from its latest checkpoint"
        )
    summary = {**dataclasses.asdict(result), "num_steps": tc.num_steps, "wall_s": time.time() - t0,
               "steps_trained": result.step - result.start_step,
               "flops_per_token": train_flops_per_token(tc.model, tc.data.seq_len)}
    if summary["steps_trained"] == 0:  # resumed at the end: no throughput of its own to report
        summary.update(_carried_figures(out, earlier, result))
    if primary:
        write_json_atomic(f"{out}/train_result.json", summary)
    rate = summary["tokens_per_s"]
    print(
        f"[train] done: step {result.step}, loss {result.loss:.4f}, "
        f"{'no' if rate is None else f'{rate:.0f}'} tokens/s, {result.skipped_steps} skipped steps"
        + (f" ({summary['carried']})" if "carried" in summary else ""),
        file=sys.stderr,
        flush=True,
    )
    # json.loads is typed Any; a dict dumped to JSON reads back as a dict
    return cast("dict[str, Any]", json.loads(json.dumps(summary, default=str)))


__all__ = [
    "RUNTIME_FIELD_KEY",
    "MixtureStage",
    "TrainConfig",
    "WarmStartConfig",
    "runtime_field",
    "train",
    "trainer_config",
]
