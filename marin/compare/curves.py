"""Curves of logged metrics on shared axes: by step, by tokens seen, by training FLOPs.

- x axes. `step` is metrics.jsonl's `step` (completed updates). `tokens` is step x tokens per update
  (`data.batch_size * data.seq_len` of the train step's train_config.json). `flops` is tokens x the training
  FLOPs per token the trainer recorded (`flops_per_token` in train_result.json, written when a run ends), or
  for a run recorded before FLOPs were logged, the same count derived from its train_config.json by its
  config class (marin/compare/flops.py); the chart says whose FLOPs were derived. A run whose records lack
  what an axis needs has no curve on it, and the chart says so.
- Smoothing (optional, stated in the chart): an exponential moving average with weight `ema` on the past,
  debiased as TensorBoard does (s_t = ema*s_{t-1} + (1-ema)*y_t, divided by 1-ema^t), so the first points are
  not pulled towards zero. Missing values are skipped.
- Downsampling (on the server, stated in the chart): a curve with more than `max_points` points keeps, in each
  of max_points/2 equal-count buckets, its lowest and highest point (in x order), plus the last point: spikes
  stay visible, and the browser never gets 10,000 points per curve.
- A curve computed from a source's cached columns (the dashboard's incremental metrics reader hands out the
  same object until the file grows) is kept, keyed on those columns, their length and the options: a run of
  10,000 logged steps is smoothed and downsampled once, not on every request.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marin.compare.flops import flops_per_token
from marin.compare.runs import Run, StepRef
from marin.compare.source import Columns, Source, number

AXES = ("step", "tokens", "flops")
AXIS_LABELS = {"step": "step", "tokens": "tokens seen", "flops": "training FLOPs"}


@dataclass(frozen=True)
class Curve:
    label: str  # the run (and the step, when a run has several curves)
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    points: int  # before downsampling
    final: float | None  # the last logged value (not smoothed)


@dataclass(frozen=True)
class CurveSet:
    metric: str
    axis: str
    curves: tuple[Curve, ...]
    missing: tuple[str, ...]  # runs with no curve on this axis, and why
    ema: float | None
    downsampled: bool
    max_points: int
    derived: tuple[str, ...] = ()  # curves whose FLOPs per token were derived from the config, not logged


def ema_smooth(ys: Sequence[float], ema: float) -> list[float]:
    out, acc = [], 0.0
    for t, y in enumerate(ys, start=1):
        acc = ema * acc + (1 - ema) * y
        out.append(acc / (1 - ema ** t))
    return out


def downsample(xs: list[float], ys: list[float], max_points: int) -> tuple[list[float], list[float]]:
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    buckets = max(1, (max_points - 1) // 2)
    keep: list[int] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if hi <= lo:
            continue
        seg = ys[lo:hi]
        i_min, i_max = lo + seg.index(min(seg)), lo + seg.index(max(seg))
        keep.extend(sorted({i_min, i_max}))
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


_CURVES: dict[tuple[Any, ...], tuple[Columns, Curve]] = {}
_LOCK = threading.Lock()


def _curve(cols: Columns, metric: str, scale: float, ema: float | None, max_points: int, label: str) -> Curve:
    key = (id(cols), len(cols.steps), metric, scale, ema, max_points)
    with _LOCK:
        hit = _CURVES.get(key)
    if hit is not None and hit[0] is cols:
        return dataclasses.replace(hit[1], label=label)
    col = cols.series[metric]
    pairs = [(s * scale, y) for s, y in zip(cols.steps, col, strict=True) if s is not None and y is not None]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    final = ys[-1] if ys else None
    if ema:
        ys = ema_smooth(ys, ema)
    dx, dy = downsample(xs, ys, max_points)
    curve = Curve(label, tuple(dx), tuple(dy), len(xs), final)
    with _LOCK:
        if len(_CURVES) >= 256:
            _CURVES.clear()
        _CURVES[key] = (cols, curve)
    return curve


def _scale(source: Source, ref: StepRef, axis: str) -> tuple[float | None, str, bool]:
    """Multiplier from step to the axis (or None and why), and whether FLOPs were derived from the config."""
    if axis == "step":
        return 1.0, "", False
    cfg = source.read_json(f"{ref.rel}/train_config.json")
    data = cfg.get("data") if isinstance(cfg, dict) else None
    batch = number(data.get("batch_size")) if isinstance(data, dict) else None
    seq = number(data.get("seq_len")) if isinstance(data, dict) else None
    if batch is None or seq is None:
        return None, "no train_config.json with data.batch_size and data.seq_len", False
    if axis == "tokens":
        return batch * seq, "", False
    fpt = flops_per_token(source, ref, cfg)
    if fpt.value is None:
        return None, fpt.why, False
    return batch * seq * fpt.value, "", fpt.derived


def curve_set(source: Source, runs: Sequence[Run], metric: str, axis: str = "step", *,
              ema: float | None = None, max_points: int = 400) -> CurveSet:
    """`metric` of every run's training steps on one shared axis."""
    if axis not in AXES:
        raise ValueError(f"axis {axis!r} is not one of {', '.join(AXES)}")
    if ema is not None and not 0.0 <= ema < 1.0:
        raise ValueError(f"smoothing {ema} must be in [0, 1) (0: none; 0.9: strong)")
    curves, missing, derived, down = [], [], [], False
    for run in runs:
        logged = [(ref, cols) for ref in run.steps
                  if (cols := source.columns(f"{ref.rel}/metrics.jsonl")) is not None
                  and metric in cols.series]
        if not logged:
            missing.append(f"{run.label}: no {metric!r} in any metrics.jsonl")
        for ref, cols in logged:
            scale, why, from_config = _scale(source, ref, axis)
            if scale is None:
                missing.append(f"{run.label}: {why}")
                continue
            label = run.label if len(logged) == 1 else f"{run.label} · {ref.name}"
            if from_config:
                derived.append(label)
            curve = _curve(cols, metric, scale, ema, max_points, label)
            down = down or len(curve.xs) < curve.points
            curves.append(curve)
    return CurveSet(metric, axis, tuple(curves), tuple(missing), ema or None, down, max_points,
                    tuple(derived))


def metric_names(source: Source, runs: Sequence[Run]) -> list[str]:
    """Every series logged by any run's training steps, `loss` first."""
    names: set[str] = set()
    for run in runs:
        for ref in run.steps:
            cols = source.columns(f"{ref.rel}/metrics.jsonl")
            if cols is not None:
                names.update(cols.series)
    names.discard("time")
    return sorted(names, key=lambda n: (n != "loss", n))
