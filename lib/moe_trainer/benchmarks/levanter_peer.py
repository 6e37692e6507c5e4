"""Levanter's side of `levanter_compare.py`: one `levanter.main.train_lm` run on CPU, offline, printing JSON.

Run with the Python of a venv holding `marin-levanter` (Python >= 3.12; not a dependency of this project):

    $PEER/levanter-venv/bin/python levanter_peer.py --vocab 32000 --steps 30 --work /tmp/lev [--interactive]

With `--interactive` (what levanter_compare.py uses) the step hook prints `LEVSTEP <step>` after every step
and waits for a line on stdin before Levanter goes on, so the driver can run its own steps in between: the two
trainers then alternate step by step on the same machine load.

The shape is the Marin CPU tutorial's `llama_nano` (hidden 32, intermediate 128, 2 layers, 2 heads, seq 512,
batch 4, float32 compute, dense). Data: a Levanter token cache of random ids
(`levanter.testing.tiny_corpus.construct_small_data_cache`) with an offline word-level tokenizer written here
(Levanter's Llama config loads a tokenizer; its "passthrough" one cannot read a prebuilt cache). Step wall
times: `step_times_s` is Levanter's own `StepInfo.step_duration` (the jitted step up to `loss.item()`), and
`loop_times_s` the wall time from one hook's return to the next hook (step, data, logging); both exclude the
first two steps and steps over 3x the median (Levanter compiles a second step variant part-way). Levanter runs
its hooks once more after the last step with that step's info: the hook ignores a step number it has seen (it
neither stamps nor pauses), so the last step counts once (`step_pairing.py`). `step_times_by_step` keys the
kept durations by Levanter's step number, which the driver pairs its own steps with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from step_pairing import kept


def _tokenizer(path: str, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return
    words = {str(i): i for i in range(vocab - 1)}
    words["<eos>"] = vocab - 1
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="0").save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--interactive", action="store_true", help="pause after every step until a stdin line")
    ap.add_argument("--work", required=True, help="scratch directory (tokenizer, cache, run outputs)")
    a = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import jax
    import levanter.main.train_lm as train_lm
    from levanter.checkpoint import CheckpointerConfig
    from levanter.distributed import DistributedConfig
    from levanter.testing.tiny_corpus import construct_small_data_cache
    from levanter.tracker.json_file import JsonFileTrackerConfig

    tok_dir = os.path.join(a.work, f"tok-{a.vocab}")
    _tokenizer(tok_dir, a.vocab)
    data_dir = os.path.join(a.work, f"data-{a.vocab}-{a.seq}")
    out = os.path.join(a.work, "run")
    shutil.rmtree(out, ignore_errors=True)
    data_config, _ = construct_small_data_cache(data_dir, num_shards=4, chunk_size=256, doc_len=a.seq,
                                                vocab_size=a.vocab, tokenizer=tok_dir)
    stamps: dict[int, tuple[float, float, float]] = {}  # step -> hook entry, hook exit, step_duration
    original_init = train_lm.Trainer.__init__

    def hook(info) -> None:  # type: ignore[no-untyped-def]
        entry, step = time.perf_counter(), int(info.step)
        if step in stamps:  # the forced run of the hooks after the last step: already counted
            return
        if a.interactive:
            print(f"LEVSTEP {step}", flush=True)
            sys.stdin.readline()
        stamps[step] = (entry, time.perf_counter(), float(info.step_duration))

    def init_with_hook(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original_init(self, *args, **kwargs)
        self.add_hook(hook, every=1)

    train_lm.Trainer.__init__ = init_with_hook
    model = train_lm.LlamaConfig(
        max_seq_len=a.seq,
        hidden_dim=a.hidden,
        intermediate_dim=a.inter,
        num_layers=a.layers,
        num_heads=a.heads,
        num_kv_heads=a.heads,
        attn_backend=None,
        tokenizer=tok_dir,
    )
    trainer = train_lm.TrainerConfig(
        num_train_steps=a.steps,
        train_batch_size=a.batch,
        max_eval_batches=1,
        steps_per_eval=1_000_000,
        tracker=JsonFileTrackerConfig(output_path=out),
        checkpointer=CheckpointerConfig(base_path=os.path.join(out, "checkpoints")),
        log_dir=Path(out) / "logs",
        require_accelerator=False,
        distributed=DistributedConfig(initialize_jax_distributed=False),
    )
    t0 = time.perf_counter()
    train_lm.main(train_lm.TrainLmConfig(data=data_config, model=model, trainer=trainer))
    main_s = time.perf_counter() - t0
    tokens = a.batch * a.seq
    by_step = kept({s: st[2] for s, st in stamps.items()})
    loops_by_step = kept({s + 1: stamps[s + 1][0] - st[1] for s, st in stamps.items() if s + 1 in stamps})
    steps, loops = list(by_step.values()), list(loops_by_step.values())
    print(
        "LEVANTER "
        + json.dumps(
            {
                "jax": jax.__version__,
                "vocab": a.vocab,
                "steps": a.steps,
                "tokens_per_step": tokens,
                "step_times_s": steps,
                "step_times_by_step": {str(k): v for k, v in by_step.items()},
                "loop_times_s": loops,
                "tokens_per_s": tokens / statistics.median(steps),
                "loop_tokens_per_s": tokens / statistics.median(loops),
                "main_s": main_s,
                "first_step_s": stamps[min(stamps)][0] - t0 if stamps else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
