"""Training-step throughput: tokens/s, step time and MFU of fixed presets on whatever device JAX sees.

    python lib/moe_trainer/benchmarks/train_throughput.py                 # CPU: tiny vs transformers (torch)
    python lib/moe_trainer/benchmarks/train_throughput.py --presets moe-1b --steps 20   # on a GPU (bf16)

Each preset's real train step (``train._compile``: loss, grads, clipping, AdamW, health guards) runs on
random tokens of the preset's shape; the first steps (compilation) are excluded from the timing. On CPU the
same-shaped ``transformers`` ``Qwen3MoeForCausalLM`` (built from ``hf.hf_config_of``, fp32, torch AdamW,
router aux loss on) is timed in the same run, and ``ratio`` = our tokens/s ÷ torch's. MFU uses the analytic
FLOPs of ``flops.flops_per_token`` and the peak table of ``metrics.py`` (CPU: an assumption, printed).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from typing import Any

import jax
import numpy as np
from moe_trainer.config import ModelConfig
from moe_trainer.metrics import peak_flops_per_device, train_flops_per_token
from moe_trainer.presets import load_preset
from moe_trainer.train import TrainConfig, _compile, build_mesh


def _batch(cfg: TrainConfig, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    b, s = cfg.data.batch_size, cfg.data.seq_len
    toks = rng.integers(0, cfg.model.vocab_size, (b, s + 1), dtype=np.int32)
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "segment_ids": np.zeros((b, s), np.int32),
            "loss_mask": np.ones((b, s), np.float32)}


def bench_jax(cfg: TrainConfig, steps: int, warmup: int) -> dict[str, Any]:
    mesh = build_mesh(cfg.mesh)
    shape = (cfg.data.batch_size, cfg.data.seq_len)
    t0 = time.perf_counter()
    comp = _compile(cfg.model, cfg.optimizer, cfg.schedule, cfg.health, cfg.accum_steps, cfg.num_steps, cfg.seed,
                    mesh, shape)
    state = comp.init()
    batches = [jax.device_put(_batch(cfg, i), comp.batch_sharding) for i in range(min(steps, 4))]
    for i in range(warmup):
        state, m = comp.step(state, batches[i % len(batches)])
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(steps):
        t = time.perf_counter()
        state, m = comp.step(state, batches[i % len(batches)])
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    tokens = shape[0] * shape[1]
    fpt = train_flops_per_token(cfg.model, cfg.data.seq_len)
    peak, peak_source = peak_flops_per_device(jax.devices()[0], mesh.size)
    if cfg.metrics.peak_flops:
        peak, peak_source = cfg.metrics.peak_flops, "metrics.peak_flops"
    tps = tokens / step_s
    return {"tokens_per_s": tps, "step_time_s": step_s, "step_times_s": times, "mfu": tps * fpt / (peak * mesh.size),
            "tokens_per_step": tokens, "train_flops_per_token": fpt, "peak_flops_per_device": peak,
            "peak_source": peak_source, "devices": mesh.size, "compile_and_warmup_s": compile_s,
            "final_loss": float(m["loss"]), "compute_dtype": cfg.model.compute_dtype}


def bench_torch(model_cfg: ModelConfig, batch: int, seq: int, steps: int, warmup: int, lr: float) -> dict[str, Any]:
    import torch
    from moe_trainer.hf import hf_config_of
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    hf = hf_config_of(model_cfg)
    hf["output_router_logits"] = True  # include the load-balancing loss, as our step does
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in hf.items() if k != "architectures"}))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(0)
    data = [torch.from_numpy(rng.integers(0, model_cfg.vocab_size, (batch, seq + 1))) for _ in range(4)]
    times = []
    for i in range(warmup + steps):
        toks = data[i % len(data)]
        t = time.perf_counter()
        out = model(input_ids=toks[:, :-1], labels=toks[:, :-1])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    return {"tokens_per_s": batch * seq / step_s, "step_time_s": step_s, "step_times_s": times,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "final_loss": float(out.loss)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=None, help="comma-separated preset names (default: tiny on CPU, "
                    "moe-1b on an accelerator)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per preset")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation) per preset")
    ap.add_argument("--batch-size", type=int, default=None, help="override the preset's batch size")
    ap.add_argument("--no-torch", action="store_true", help="skip the transformers reference on CPU")
    args = ap.parse_args()
    platform_name = jax.devices()[0].platform
    names = args.presets.split(",") if args.presets else (["tiny"] if platform_name == "cpu" else ["moe-1b"])
    report: dict[str, Any] = {"device": str(jax.devices()[0].device_kind), "platform": platform_name,
                              "device_count": jax.device_count(), "cpu_count": os.cpu_count(),
                              "jax": jax.__version__, "python": platform.python_version(),
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "presets": {}}
    for name in names:
        cfg = load_preset(name)
        if args.batch_size:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=args.batch_size))
        cfg = dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, data=-1, expert=1, model=1))
        if platform_name == "cpu" and cfg.model.compute_dtype != "float32":
            cfg = dataclasses.replace(cfg, model=cfg.model.replace(compute_dtype="float32"))
        entry: dict[str, Any] = {"batch_size": cfg.data.batch_size, "seq_len": cfg.data.seq_len,
                                 "jax": bench_jax(cfg, args.steps, args.warmup)}
        if platform_name == "cpu" and not args.no_torch:
            ref = bench_torch(cfg.model, cfg.data.batch_size, cfg.data.seq_len, args.steps, args.warmup,
                              cfg.optimizer.lr)
            ref["mfu"] = ref["tokens_per_s"] * entry["jax"]["train_flops_per_token"] / (
                entry["jax"]["peak_flops_per_device"] * entry["jax"]["devices"])
            entry["torch_transformers"] = ref
            entry["ratio_jax_over_torch"] = entry["jax"]["tokens_per_s"] / ref["tokens_per_s"]
        report["presets"][name] = entry
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
