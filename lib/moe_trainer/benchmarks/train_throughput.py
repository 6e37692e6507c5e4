"""Training-step throughput: tokens/s, step time and MFU of fixed presets on whatever device JAX sees.

    python lib/moe_trainer/benchmarks/train_throughput.py                 # CPU: tiny vs transformers (torch)
    python lib/moe_trainer/benchmarks/train_throughput.py --presets moe-1b --steps 20   # on a GPU (bf16)
    python lib/moe_trainer/benchmarks/train_throughput.py --depth-sweep 2,8,16          # compile time vs
    depth python lib/moe_trainer/benchmarks/train_throughput.py --presets moe-1b --no-torch --steps 2 \
        --override n_layers=2,d_model=128,n_experts=8,vocab_size=4096 --seq-len 256 --batch-size 2  # CPU
        check

Each preset's real train step (``harness.JaxStep``: loss, grads, clipping, AdamW, health guards) runs on
random tokens of the preset's shape; the first steps (compilation) are excluded from the timing. On CPU the
same-shaped ``transformers`` ``Qwen3MoeForCausalLM`` (built from ``hf.hf_config_of``, fp32, torch AdamW,
router aux loss on) is timed in the same run, its steps interleaved with ours so both see the same machine
load; ``ratio_jax_over_torch`` = our median tokens/s ÷ torch's, ``ratio_paired_median`` = the median over
steps of (torch step time ÷ our step time). MFU uses the analytic
FLOPs of ``flops.flops_per_token`` and the peak table of ``metrics.py`` (CPU: an assumption, printed).
On a GPU, `--presets moe-1b` keeps the preset's bfloat16 compute (attention through cuDNN, expert matmuls
through `ragged_dot`, layers scanned) and prints the JSON (stdout) plus one `MFU <preset> <value>` line per
preset (stderr); on CPU the compute dtype is float32 unless `--keep-dtype`. `--override` changes ModelConfig
fields (`key=value,...`), `--seq-len` the sequence length: that is how the moe-1b script is checked on a CPU.

`--depth-sweep 2,8,16` (with `--presets`, default tiny) instead times lowering + XLA compilation of the whole
train step at each depth, scanned and unrolled (`scan_layers`), and reports each one's ratio to the shallowest
depth (the target: 16 layers scanned <= 1.5x 2 layers). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np
from harness import JaxStep, compile_step, data_parallel, parse_value, random_batch

from moe_trainer.compiled import clear_compiled
from moe_trainer.config import ModelConfig
from moe_trainer.metrics import peak_flops_per_device, train_flops_per_token
from moe_trainer.presets import load_preset
from moe_trainer.train_config import TrainConfig


class TorchStep:
    """The same-shaped transformers Qwen3MoeForCausalLM training step (fp32, AdamW, clipping, aux loss)."""

    def __init__(self, model_cfg: ModelConfig, batch: int, seq: int, lr: float) -> None:
        import torch
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        from moe_trainer.hf import hf_config_of

        self.torch = torch
        torch.manual_seed(0)
        torch.set_num_threads(os.cpu_count() or 1)
        hf = hf_config_of(model_cfg)
        hf["output_router_logits"] = True  # include the load-balancing loss, as our step does
        self.model = Qwen3MoeForCausalLM(
            Qwen3MoeConfig(**{k: v for k, v in hf.items() if k != "architectures"})
        )
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        rng = np.random.default_rng(0)
        self.data = [
            torch.from_numpy(rng.integers(0, model_cfg.vocab_size, (batch, seq + 1))) for _ in range(4)
        ]
        self.i = 0
        self.loss = float("nan")
        self.cpu: list[float] = []

    def __call__(self) -> float:
        toks = self.data[self.i % len(self.data)]
        t, c = time.perf_counter(), time.process_time()
        out = self.model(input_ids=toks[:, :-1], labels=toks[:, :-1])
        out.loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.i += 1
        self.loss = float(out.loss.detach())
        self.cpu.append(time.process_time() - c)
        return time.perf_counter() - t


def _summary(
    times: list[float], cpu: list[float], tokens: int, fpt: float, peak_total: float
) -> dict[str, Any]:
    step_s = statistics.median(times)
    tps = tokens / step_s
    return {
        "tokens_per_s": tps,
        "step_time_s": step_s,
        "step_times_s": times,
        "mfu": tps * fpt / peak_total,
        "cpu_s_per_step": statistics.median(cpu[-len(times) :]) if times else float("nan"),
    }


def bench_preset(
    cfg: TrainConfig, steps: int, warmup: int, with_torch: bool, only: str | None = None
) -> dict[str, Any]:
    """Time our step (and, interleaved step by step, the torch reference: both then see the same machine
    load, which matters on a shared host). ``only`` = "torch" times the reference alone (its process CPU
    seconds are then uncontaminated by the other framework's idle threads)."""
    t0 = time.perf_counter()
    ours = JaxStep(cfg) if only != "torch" else None
    for _ in range(warmup if ours else 0):
        ours()  # type: ignore[misc]
    compile_s = time.perf_counter() - t0
    ref = (
        TorchStep(cfg.model, cfg.data.batch_size, cfg.data.seq_len, cfg.optimizer.lr)
        if with_torch or only == "torch"
        else None
    )
    for _ in range(warmup if ref else 0):
        ref()  # type: ignore[misc]
    ours_t: list[float] = []
    ref_t: list[float] = []
    for _ in range(steps):
        if ours is not None:
            ours_t.append(ours())
        if ref is not None:
            ref_t.append(ref())
    tokens = cfg.data.batch_size * cfg.data.seq_len
    fpt = train_flops_per_token(cfg.model, cfg.data.seq_len)
    n_dev = ours.mesh.size if ours else 1
    peak, source = peak_flops_per_device(jax.devices()[0], n_dev)
    if cfg.metrics.peak_flops:
        peak, source = cfg.metrics.peak_flops, "metrics.peak_flops"
    peak_total = peak * n_dev
    entry: dict[str, Any] = {
        "batch_size": cfg.data.batch_size,
        "seq_len": cfg.data.seq_len,
        "tokens_per_step": tokens,
        "train_flops_per_token": fpt,
        "peak_flops_per_device": peak,
        "peak_source": source,
        "devices": n_dev,
        "compute_dtype": cfg.model.compute_dtype,
    }
    if ours is not None:
        entry["jax"] = {
            **_summary(ours_t, ours.cpu, tokens, fpt, peak_total),
            "compile_and_warmup_s": compile_s,
            "final_loss": ours.loss,
        }
    if ref is not None:
        import torch

        entry["torch_transformers"] = {
            **_summary(ref_t, ref.cpu, tokens, fpt, peak_total),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "final_loss": ref.loss,
        }
    if ours is not None and ref is not None:
        torch_tps = entry["torch_transformers"]["tokens_per_s"]
        entry["ratio_jax_over_torch"] = entry["jax"]["tokens_per_s"] / torch_tps
        paired = [r / o for o, r in zip(ours_t, ref_t, strict=True)]
        entry["ratio_paired_median"] = statistics.median(paired)
    return entry


def apply_override(cfg: TrainConfig, override: str | None, seq_len: int | None) -> TrainConfig:
    """ModelConfig changes from `key=value,...` (and the sequence length), validated by ModelConfig."""
    if override:
        changes = {}
        for item in override.split(","):
            key, eq, val = item.partition("=")
            if not eq:
                raise SystemExit(f"--override: {item!r} is not key=value")
            changes[key] = parse_value(val)
        cfg = dataclasses.replace(cfg, model=cfg.model.replace(**changes))
    if seq_len:
        cfg = dataclasses.replace(
            cfg,
            data=dataclasses.replace(cfg.data, seq_len=seq_len),
            model=cfg.model.replace(max_seq_len=max(seq_len, cfg.model.max_seq_len)),
        )
    return cfg


def compile_seconds(cfg: TrainConfig) -> float:
    """Wall seconds to lower and compile the train step of `cfg` (abstract state: nothing is allocated)."""
    comp = compile_step(cfg)
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=comp.batch_sharding)
        for k, v in random_batch(cfg, 0).items()
    }
    state = jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), comp.abstract_state, comp.shardings
    )
    t0 = time.perf_counter()
    comp.step.lower(state, batch).compile()
    return time.perf_counter() - t0


def depth_sweep(
    cfg: TrainConfig, depths: list[int], repeats: int, forms: tuple[str, ...] = ("scanned", "unrolled")
) -> dict[str, Any]:
    """Compile time at each depth, scanned and/or unrolled, alternating (median of `repeats`)."""
    out: dict[str, Any] = {}
    for scan in [f == "scanned" for f in forms]:
        times: dict[int, list[float]] = {d: [] for d in depths}
        for _ in range(repeats):
            for d in depths:
                c = dataclasses.replace(cfg, model=cfg.model.replace(n_layers=d, scan_layers=scan))
                clear_compiled()
                times[d].append(compile_seconds(c))
                print(
                    f"compile {'scanned' if scan else 'unrolled'} {d} layers: {times[d][-1]:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        med = {d: statistics.median(ts) for d, ts in times.items()}
        out["scanned" if scan else "unrolled"] = {
            "compile_s": {str(d): med[d] for d in depths},
            "compile_s_all": {str(d): ts for d, ts in times.items()},
            f"ratio_{depths[-1]}_over_{depths[0]}": med[depths[-1]] / med[depths[0]],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--presets",
        default=None,
        help="comma-separated preset names (default: tiny on CPU, moe-1b on an accelerator)",
    )
    ap.add_argument("--steps", type=int, default=10, help="timed steps per preset")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation) per preset")
    ap.add_argument("--batch-size", type=int, default=None, help="override the preset's batch size")
    ap.add_argument("--no-torch", action="store_true", help="skip the transformers reference on CPU")
    ap.add_argument(
        "--only",
        choices=["jax", "torch"],
        default=None,
        help="time one framework alone (clean per-process CPU seconds on a shared host)",
    )
    ap.add_argument("--override", default=None, help="ModelConfig changes, key=value,... (e.g. n_layers=2)")
    ap.add_argument("--seq-len", type=int, default=None, help="override the preset's sequence length")
    ap.add_argument("--keep-dtype", action="store_true", help="keep the preset's compute dtype on CPU")
    ap.add_argument("--depth-sweep", default=None, help="comma-separated depths: time compilation instead")
    ap.add_argument("--repeats", type=int, default=3, help="compilations per depth in --depth-sweep")
    ap.add_argument(
        "--forms", default="scanned,unrolled", help="--depth-sweep forms: scanned, unrolled or both"
    )
    args = ap.parse_args()
    platform_name = jax.devices()[0].platform
    names = args.presets.split(",") if args.presets else (["tiny"] if platform_name == "cpu" else ["moe-1b"])
    report: dict[str, Any] = {
        "device": str(jax.devices()[0].device_kind),
        "platform": platform_name,
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "presets": {},
    }
    if args.depth_sweep:
        depths = [int(d) for d in args.depth_sweep.split(",")]
        for name in names:
            cfg = data_parallel(apply_override(load_preset(name), args.override, args.seq_len))
            if args.batch_size:
                cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=args.batch_size))
            report["presets"][name] = {
                "depth_sweep": depth_sweep(cfg, depths, args.repeats, tuple(args.forms.split(",")))
            }
        print(json.dumps(report, indent=1))
        return
    for name in names:
        cfg = apply_override(load_preset(name), args.override, args.seq_len)
        if args.batch_size:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=args.batch_size))
        cfg = data_parallel(cfg)
        if platform_name == "cpu" and cfg.model.compute_dtype != "float32" and not args.keep_dtype:
            cfg = dataclasses.replace(cfg, model=cfg.model.replace(compute_dtype="float32"))
        with_torch = platform_name == "cpu" and not args.no_torch and args.only != "jax"
        entry = bench_preset(cfg, args.steps, args.warmup, with_torch, args.only)
        report["presets"][name] = entry
    print(json.dumps(report, indent=1))
    for name, entry in report["presets"].items():
        if "jax" in entry:
            print(
                f"MFU {name} {entry['jax']['mfu']:.4f} ({entry['compute_dtype']}, seq {entry['seq_len']}, "
                f"{entry['jax']['tokens_per_s']:.0f} tokens/s, peak {entry['peak_source']})",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
