"""Run observability: ``metrics.jsonl`` every step, Weights & Biases (offline by default), a tqdm bar, MFU.

``metrics.jsonl`` rows follow docs/formats.md ("Trainer outputs"): one JSON object per optimizer step with
``step, loss, lr, grad_norm, update_norm, skipped, clipped, tokens_per_s, mfu, aux_loss, router_z_loss,
logit_z_loss, drop_rate, expert_load, routing_entropy, time`` (plus ``ce_loss`` and the individual health
flags), and evaluation rows carrying ``"eval"`` (and ``"eval_capacity"`` for a capacity-limited model).

W&B runs in ``offline`` mode unless the config says ``online``: the run files stay under the output
directory (``wandb sync`` uploads them later) and ``wandb.json`` records ``{project, run_id, mode, dir,
url}``. A resumed run reuses the run id from ``wandb.json``. In a multi-host run only process 0 writes any of
this (the other processes' writers are disabled).

MFU = model FLOPs per token (forward + backward, ``flops.flops_per_token``) × tokens/s ÷ (peak FLOP/s per
device × devices). Peaks are dense bf16 datasheet figures (never the sparse ones). On CPU there is no
datasheet: we assume 32 fp32 FLOP/cycle/core (two AVX2 FMA units, 8 lanes) at 3 GHz, i.e. 96 GFLOP/s per core
over ``os.cpu_count()`` cores, shared by all (fake) CPU devices. Override with ``metrics.peak_flops``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
import uuid
from typing import Any

import fsspec
import jax
import numpy as np

from moe_trainer.jsonio import read_json, write_atomic
from moe_trainer.jsonl import JsonlFile, is_local

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s per chip, by substrings of jax's device_kind (lower case), most specific first.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12), ("h100", 989e12), ("h800", 989e12), ("gb200", 2.5e15), ("b200", 2.25e15),
    ("a100", 312e12), ("l40s", 362e12), ("a10g", 125e12),
    ("tpu v6", 918e12), ("tpu v5p", 459e12), ("tpu v5 lite", 197e12), ("tpu v5e", 197e12),
    ("tpu v5", 459e12), ("tpu v4", 275e12),
)
CPU_FLOPS_PER_CORE = 32 * 3.0e9


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where metrics go: metrics.jsonl (always), W&B, the terminal progress bar."""

    wandb_project: str = "moe-trainer"
    """W&B project name."""
    wandb_mode: str = "offline"
    """offline (files only, nothing leaves the machine), online, or disabled."""
    run_name: str | None = None
    """W&B run name (default: the output directory's name)."""
    progress_bar: bool = True
    """Show a tqdm progress bar with ETA on the terminal."""
    peak_flops: float | None = None
    """Peak FLOP/s per device for MFU; default from the device-kind table (see metrics.py)."""

    def __post_init__(self) -> None:
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(f"metrics.wandb_mode={self.wandb_mode!r} must be offline, online or disabled")


def peak_flops_per_device(device: jax.Device | None = None, n_devices: int | None = None) -> tuple[float,
                                                                                                   str]:
    """(peak FLOP/s of one device, where the figure comes from) for MFU."""
    device = device or jax.devices()[0]
    kind = str(getattr(device, "device_kind", "")).lower()
    if device.platform == "cpu":
        n = n_devices or jax.device_count()
        cores = os.cpu_count() or 1
        note = f"cpu assumption: {cores} cores x 96 GFLOP/s fp32, over {n} devices"
        return CPU_FLOPS_PER_CORE * cores / n, note
    for key, value in PEAK_FLOPS:
        if key in kind:
            return value, f"dense bf16 datasheet peak for {kind!r}"
    raise ValueError(
        f"no peak-FLOPs entry for device kind {kind!r}; set metrics.peak_flops to its dense bf16 FLOP/s"
    )


def _jsonable(x: Any) -> Any:
    """Plain JSON values: arrays become (nested) lists, and NaN/Inf become the strings "nan"/"inf" (JSON has
    no non-finite numbers; the fact must stay visible)."""
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray | np.generic | jax.Array):
        return _jsonable(np.asarray(x).tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


class MetricsWriter:
    """Appends rows to ``{output_dir}/metrics.jsonl`` and mirrors them to W&B and a progress bar."""

    def __init__(self, output_dir: str, cfg: MetricsConfig, *, run_config: dict[str, Any], total_steps: int,
                 start_step: int, enabled: bool = True) -> None:
        """``enabled=False`` (every process of a multi-host run but process 0) writes nothing at all: no file,
        no W&B run, no progress bar; ``log`` and ``close`` do nothing."""
        self.output_dir = output_dir.rstrip("/")
        self.cfg = cfg
        self.enabled = enabled
        self._wandb: Any = None
        self._bar: Any = None
        if not enabled:
            return
        self.fs, self.root = fsspec.core.url_to_fs(self.output_dir)
        self.fs.makedirs(self.root, exist_ok=True)
        self.path = f"{self.root}/metrics.jsonl"
        rows: list[str] = []
        if start_step == 0 and self.fs.exists(self.path):
            self.fs.rm(self.path)  # a fresh run (no checkpoint) starts a fresh history
        elif start_step > 0:
            rows = self._truncate_after(start_step)
        # Object stores cannot append: there the whole file is rewritten from memory every 50 rows (jsonl.py).
        self._file = JsonlFile(self.fs, self.path, local=is_local(self.output_dir), lines=rows, batch=50)
        self._wandb = self._init_wandb(run_config)
        self._bar = None
        if cfg.progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def _truncate_after(self, start_step: int) -> list[str]:
        """Drop rows of steps > start_step (written after the checkpoint we resume from), so the history
        stays one row per step; returns the rows kept."""
        if not self.fs.exists(self.path):
            return []
        with self.fs.open(self.path, "r") as f:
            rows = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= start_step]
        with self.fs.open(self.path, "w") as f:
            f.writelines(rows)
        return rows

    def _init_wandb(self, run_config: dict[str, Any]) -> Any:
        if self.cfg.wandb_mode == "disabled":
            return None
        import wandb

        ref_path = f"{self.root}/wandb.json"
        earlier = read_json(ref_path, self.fs)
        run_id = (earlier or {}).get("run_id") or uuid.uuid4().hex[:12]
        local_dir = self.output_dir if "://" not in self.output_dir else os.path.abspath("wandb-runs")
        os.makedirs(local_dir, exist_ok=True)
        mode: Any = self.cfg.wandb_mode  # validated in MetricsConfig
        kwargs: dict[str, Any] = dict(project=self.cfg.wandb_project,
                                      name=self.cfg.run_name or os.path.basename(self.root),
                                      id=run_id, resume="allow", dir=local_dir, mode=mode, config=run_config,
                                      settings=wandb.Settings(silent=True, console="off"))
        runs_dir = os.path.join(local_dir, "wandb")
        before = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
        try:
            run = wandb.init(**kwargs)
        except Exception as e:  # wandb's ServerResponseError (a private module): matched by name and message
            in_use = type(e).__name__ == "ServerResponseError" and "is in use" in str(e)
            if not in_use or not os.environ.get("WANDB_SERVICE"):
                raise
            # The wandb-core service was inherited from a parent process (WANDB_SERVICE), and it still holds
            # this run for a process that died without finishing it (a SIGKILLed or preempted attempt we
            # now resume). That stale stream never ends, so resume through a service of our own.
            log.warning("W&B run %s is still held by a dead attempt in the inherited wandb service; resuming "
                        "it through a private service", run_id)
            wandb.teardown()
            os.environ.pop("WANDB_SERVICE", None)
            for name in set(os.listdir(runs_dir)) - before if os.path.isdir(runs_dir) else ():
                if name.startswith("offline-run-") and run_id in name:  # the refused init's empty run
                    shutil.rmtree(os.path.join(runs_dir, name), ignore_errors=True)
            run = wandb.init(**kwargs)
        url = run.url if self.cfg.wandb_mode == "online" else None
        ref = {"project": self.cfg.wandb_project, "run_id": run_id, "mode": self.cfg.wandb_mode,
               "dir": os.path.abspath(local_dir), "url": url}
        write_atomic(self.fs, ref_path, [json.dumps(ref).encode()])
        return run

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = _jsonable(row)
        self._file.append(json.dumps(row) + "\n", durable="eval" in row)
        if self._wandb is not None:
            self._wandb.log(_flatten_for_wandb(row), step=int(row["step"]))
        if self._bar is not None and "loss" in row:
            self._bar.update(int(row["step"]) - self._bar.n)
            self._bar.set_postfix(loss=f"{row['loss']:.4f}" if isinstance(row["loss"],
                                                                          float) else row["loss"],
                                  tok_s=f"{row.get('tokens_per_s', 0):.0f}", refresh=False)

    def flush(self) -> None:
        """Make every logged row durable (object stores buffer up to 50 rows); called before a checkpoint."""
        if self.enabled:
            self._file.flush()

    def close(self) -> None:
        self.flush()
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()


def _flatten_for_wandb(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in ("step", "time"):
            continue
        if k in ("eval", "eval_capacity") and isinstance(v, dict):
            prefix = "eval" if k == "eval" else "eval_capacity"
            for dom, d in v.get("domains", {}).items():
                out.update({f"{prefix}/{dom}/{m}": d[m] for m in ("loss", "bpb")})
            for agg in ("micro", "macro"):
                out.update({f"{prefix}/{agg}_{m}": v[agg][m] for m in ("loss", "bpb") if agg in v})
        elif k == "expert_load" and isinstance(v, list):
            for i, layer in enumerate(v):
                if layer:
                    out[f"router/layer{i}/max_load"] = max(layer)
                    out[f"router/layer{i}/min_load"] = min(layer)
        elif k == "routing_entropy" and isinstance(v, list):
            out.update({f"router/layer{i}/entropy": e for i, e in enumerate(v)})
        elif isinstance(v, bool | int | float):
            out[f"train/{k}"] = v
    return out


def now() -> float:
    return time.time()


def train_flops_per_token(cfg: Any, seq_len: int) -> float:
    """Model FLOPs of one training token (forward + 2x backward, dropless; see ``flops.py``'s convention)."""
    from moe_trainer.flops import flops_per_token

    return float(flops_per_token(cfg, seq_len).total)
