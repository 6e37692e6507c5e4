"""Our train step against Levanter's (`marin-levanter`) on the Marin CPU tutorial's `llama_nano` shape, the
two
alternating step by step in one run; prints one JSON object.

    python lib/moe_trainer/benchmarks/levanter_compare.py --peer-python $PEER/levanter-venv/bin/python \\
        --vocabs 32000,128256 --steps 30 [--variants auto,ynn_on:ynn=on,rows:loss_vocab_block=0]

Shape (both sides): hidden 32, intermediate 128, 2 layers, 2 heads (head_dim 16, no GQA), seq 512, batch 4,
float32 compute, dense, untied head, RoPE, AdamW with clipping. Levanter runs `levanter.main.train_lm` in a
subprocess with its own venv (`levanter_peer.py --interactive`: it pauses after every step); between two of
its steps this process runs one step of each of our variants (`harness.JaxStep`, the real train step on random
tokens). So every pair of steps sees the same machine load, which on a shared 2-core host matters more than
anything else.

Variants: `name[:key=value,...]`; keys are ModelConfig fields (ints, bools, strings) and `ynn` = on | off |
auto (XLA:CPU's YNNPACK fusions; auto = `compiled.compiler_options`' per-model choice). "auto" alone is our
defaults. Per vocabulary the report gives each side's median tokens/s over its timed steps (Levanter: its
`step_duration`, the jitted step up to `loss.item()`; ours: step dispatch to `block_until_ready`), the ratio
ours / Levanter, and the median, minimum and maximum over steps of the paired ratio (Levanter's step time /
ours): our step run right after Levanter's step k is paired with step k, by Levanter's step number, and its
forced extra run of the hooks after the last step is not counted (step_pairing.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any

import jax
from harness import JaxStep, data_parallel, parse_value
from step_pairing import UNTIMED_STEPS, paired_ratios

from moe_trainer.config import ModelConfig
from moe_trainer.presets import load_preset
from moe_trainer.train_config import TrainConfig

YNN = {"on": (), "off": (("xla_cpu_experimental_ynn_fusion_type", ""),), "auto": None}


def nano_config(vocab: int) -> TrainConfig:
    """The llama_nano shape as our TrainConfig (the tiny preset's optimizer, schedule and health guards)."""
    base = load_preset("tiny")
    model = ModelConfig(
        vocab_size=vocab,
        d_model=32,
        n_layers=2,
        n_heads=2,
        n_kv_heads=2,
        head_dim=16,
        d_ff=128,
        n_experts=0,
        qk_norm=False,
        tie_embeddings=False,
        max_seq_len=512,
        compute_dtype="float32",
        logit_z_loss_coef=0.0,
    )
    return data_parallel(
        dataclasses.replace(base, model=model, data=dataclasses.replace(base.data, seq_len=512, batch_size=4))
    )


def parse_variant(spec: str) -> tuple[str, dict[str, object], tuple[tuple[str, str], ...] | None]:
    """`name[:key=value,...]` -> (name, ModelConfig changes, xla options or None for the per-model choice)."""
    name, _, rest = spec.partition(":")
    changes: dict[str, object] = {}
    ynn: tuple[tuple[str, str], ...] | None = None
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise SystemExit(f"variant {spec!r}: {item!r} is not key=value")
        if key == "ynn":
            if val not in YNN:
                raise SystemExit(f"variant {spec!r}: ynn must be on, off or auto, not {val!r}")
            ynn = YNN[val]
        elif key in {f.name for f in dataclasses.fields(ModelConfig)}:
            changes[key] = parse_value(val)
        else:
            raise SystemExit(f"variant {spec!r}: {key!r} is neither a ModelConfig field nor ynn")
    return name, changes, ynn


def compare(vocab: int, args: argparse.Namespace, variants: list[str]) -> dict[str, Any]:
    work = os.path.join(args.work, f"v{vocab}")
    os.makedirs(work, exist_ok=True)
    log = open(os.path.join(work, "peer.log"), "w")  # noqa: SIM115 (open for the peer's lifetime, closed below)
    peer = subprocess.Popen(
        [
            args.peer_python,
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "levanter_peer.py"),
            "--vocab",
            str(vocab),
            "--steps",
            str(args.steps),
            "--work",
            work,
            "--interactive",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        cwd=work,
        env={**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"},
    )
    ours: dict[str, JaxStep] = {}
    compile_s: dict[str, float] = {}
    for spec in variants:
        name, changes, xla = parse_variant(spec)
        cfg = nano_config(vocab)
        cfg = dataclasses.replace(cfg, model=cfg.model.replace(**changes))
        t0 = time.perf_counter()
        ours[name] = JaxStep(cfg, xla)
        for _ in range(args.warmup):
            ours[name]()
        compile_s[name] = time.perf_counter() - t0
    times: dict[str, dict[int, float]] = {n: {} for n in ours}  # Levanter's step number -> our step's time
    seen: set[int] = set()
    report: dict[str, Any] = {}
    assert peer.stdout is not None and peer.stdin is not None
    for line in peer.stdout:
        if line.startswith("LEVSTEP"):
            lev_step = int(line.split()[1])
            # Levanter's first steps compile; a number seen before is its forced last run of the hooks
            if lev_step >= UNTIMED_STEPS and lev_step not in seen:
                seen.add(lev_step)
                for n, step in ours.items():
                    times[n][lev_step] = step()
            peer.stdin.write("go\n")
            peer.stdin.flush()
        elif line.startswith("LEVANTER "):
            report["levanter"] = json.loads(line[len("LEVANTER ") :])
    peer.wait()
    log.close()
    if peer.returncode != 0 or "levanter" not in report:
        raise SystemExit(f"the Levanter run failed (exit {peer.returncode}): see {work}/peer.log")
    lev = report["levanter"]
    tokens = lev["tokens_per_step"]
    lev_by_step = {int(k): float(v) for k, v in lev["step_times_by_step"].items()}
    for n, by_step in times.items():
        # paired by Levanter's step number: its outliers drop their pair, never shift the ones after them
        paired = paired_ratios(lev_by_step, by_step)
        ts = list(by_step.values())
        tps = tokens / statistics.median(ts)
        report[n] = {
            "tokens_per_s": tps,
            "step_times_s": ts,
            "pairs": len(paired),
            "compile_and_warmup_s": compile_s[n],
            "final_loss": ours[n].loss,
            "ratio_vs_levanter": tps / lev["tokens_per_s"],
            "ratio_vs_levanter_loop": tps / lev["loop_tokens_per_s"],
            "paired_ratio_median": statistics.median(paired),
            "paired_ratio_min": min(paired),
            "paired_ratio_max": max(paired),
        }
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer-python", required=True, help="python of a venv with marin-levanter installed")
    ap.add_argument("--vocabs", default="32000,128256")
    ap.add_argument(
        "--steps", type=int, default=30, help="Levanter steps per vocabulary (the first 2 untimed)"
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each of our variants")
    ap.add_argument(
        "--variants", default="auto", help="comma-free list separated by ';' or one per --variants"
    )
    ap.add_argument("--work", default=None, help="scratch dir (default: a temporary one)")
    args = ap.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="levanter-compare-")
    variants = [v for v in args.variants.split(";") if v]
    report: dict[str, Any] = {
        "platform": jax.devices()[0].platform,
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_start": os.getloadavg(),
        "variants": variants,
        "vocabs": {},
    }
    for vocab in [int(v) for v in args.vocabs.split(",")]:
        report["vocabs"][str(vocab)] = compare(vocab, args, variants)
    report["load_avg_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
