"""evaluate_choices: multiple-choice accuracy by log-likelihood, with lm-evaluation-harness's conventions.

A task is a JSONL file, one item per line: ``{"context": str, "choices": [str, ...], "gold": int}`` (other
fields, such as ``id`` and ``source``, are carried through). Each choice is scored by the summed
log-probability of its tokens given the context, and the item's prediction is the best choice:

- ``acc``: argmax of the log-likelihood;
- ``acc_norm``: argmax of log-likelihood / len(choice) in *characters* (what lm-eval 0.4's ``acc_norm``
  computes, although its documentation speaks of bytes);
- ``acc_bytes``: argmax of log-likelihood / UTF-8 bytes of the choice (lm-eval's ``acc_bytes``);

each with the standard error of a mean, sample std / sqrt(n) (lm-eval's ``mean_stderr``). Ties go to the
first choice, as numpy's argmax does.

Tokenization follows lm-eval's ``_encode_pair`` for causal models, so both score the same tokens: trailing
whitespace of the context moves to the front of the continuation; the pair is encoded as one string
``context + choice`` and as ``context`` alone (no special tokens), and the choice's tokens are the whole
encoding minus the first len(context tokens) tokens. A BPE merge across the boundary is thereby scored as
part of the choice. The model reads ``(context + choice tokens)[-(L+1):][:-1]`` (left truncation to the
model's max_seq_len L, as lm-eval does at its max_length). docs/evaluation.md has the details and the parity
test against lm-eval.

Outputs under ``output_path``::

    choices.json            {"tasks": {name: {"items", "acc", "acc_stderr", "acc_norm", ...}}, "conventions"}
    items/<task>.jsonl      per item: id, gold, pred, pred_norm, pred_bytes, loglik and tokens per choice

Routing is dropless and the model computes in its checkpoint's compute dtype with float32 log-softmax.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import fsspec
import jax
import jax.numpy as jnp
import numpy as np

from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.config import ModelConfig
from moe_trainer.jsonio import write_bytes_atomic, write_json_atomic
from moe_trainer.model import Model, forward
from operators.tasks import shipped_tasks, task_path
from operators.train import runtime_field

Encode = Callable[[str], list[int]]


@dataclasses.dataclass(frozen=True)
class ChoiceItem:
    context: str
    choices: tuple[str, ...]
    gold: int
    extra: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class EvaluateChoicesConfig:
    output_path: str
    """Where choices.json and items/ are written (the step's own output path)."""
    checkpoint: str
    """A train step's output path (newest complete checkpoint), its checkpoints/ directory or one step's."""
    tokenizer: str
    """A train_tokenizer step's output path (its tokenizer.json is used) or the path of a tokenizer.json."""
    tasks: tuple[str, ...] = ()
    """Shipped task names (operators/tasks, e.g. stdlib_next_line_v1) or JSONL paths; () for all shipped."""
    max_items: int | None = None
    """Score at most the first this many items of each task (None: all)."""
    batch_size: int = runtime_field(default=32)
    """Sequences per forward pass (speed/memory only)."""

    # What this step writes (marin/status/results.py): per task, the accuracies and their standard errors.
    RESULT_METRICS: ClassVar[tuple[str, ...]] = tuple(
        f"choices.json/tasks.*.{key}" for key in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr",
                                                  "acc_bytes", "acc_bytes_stderr", "items", "chance"))
    HEADLINE_METRICS: ClassVar[tuple[str, ...]] = ("choices.json/tasks.*.acc",
                                                   "choices.json/tasks.*.acc_norm")

    def __post_init__(self) -> None:
        if self.max_items is not None and self.max_items < 1:
            raise ValueError(f"evaluate_choices: max_items={self.max_items} must be >= 1 or None")
        if self.batch_size < 1:
            raise ValueError(f"evaluate_choices: batch_size={self.batch_size} must be >= 1")
        for t in self.tasks:
            if not t.endswith(".jsonl"):
                task_path(t)  # raises, listing the shipped names

    def raw_input_paths(self) -> tuple[str, ...]:
        """The shipped task files this step reads (the engine fingerprints them as raw inputs; JSONL paths
        in `tasks` are config values, fingerprinted as such)."""
        return tuple(path for name, path in sorted(_task_files(self).items())
                     if not any(t == path for t in self.tasks))


def _fail(where: str, problem: str) -> None:
    raise ValueError(f"{where}: {problem}; each line must be a JSON object "
                     '{"context": "<non-empty text>", "choices": ["<text>", ...], "gold": <answer index>}')


def read_task(path: str, max_items: int | None = None) -> list[ChoiceItem]:
    """The items of a task file, checked line by line (errors name the file and line)."""
    items: list[ChoiceItem] = []
    with fsspec.open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from e
            if not isinstance(row, dict):
                _fail(where, "not a JSON object")
            ctx, choices, gold = row.get("context"), row.get("choices"), row.get("gold")
            if not isinstance(ctx, str) or not ctx:
                _fail(where, "context is missing or empty")
            if (not isinstance(choices, list) or len(choices) < 2
                    or not all(isinstance(c, str) and c for c in choices)):
                _fail(where, "choices must be a list of at least two non-empty strings")
            if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
                _fail(where, f"gold={gold!r} is not an index into the {len(choices)} choices")
            extra = {k: v for k, v in row.items() if k not in ("context", "choices", "gold")}
            items.append(ChoiceItem(ctx, tuple(choices), gold, extra))
            if max_items is not None and len(items) >= max_items:
                break
    if not items:
        raise ValueError(f"{path}: no items")
    return items


def encode_pair(encode: Encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's causal ``_encode_pair``: (context tokens, continuation tokens) as the model will see them."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


@partial(jax.jit, static_argnames=("cfg", "dispatch"))
def _batch_loglik(params: Any, tokens: jax.Array, targets: jax.Array, mask: jax.Array, cfg: ModelConfig,
                  dispatch: str | None) -> jax.Array:
    logits, _ = forward(params, tokens, cfg, dispatch=dispatch, capacity_factor=None)  # [B, S, V] float32
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(picked * mask, axis=-1)


def score_pairs(model: Model, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int = 32
                ) -> np.ndarray:
    """Summed log-probability of each continuation given its context (float64 array, one per pair)."""
    cfg = model.config
    max_len = cfg.max_seq_len
    dispatch = "ragged" if cfg.dispatch.startswith("ep_") else None
    rows = []
    for ctx, cont in pairs:
        if not cont:
            raise ValueError("a choice encodes to no tokens after its context; make every choice non-empty")
        seq = (ctx + cont)[-(max_len + 1):]
        rows.append((seq[:-1], seq[1:], min(len(cont), len(seq) - 1)))
    out = np.zeros(len(rows))
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(rows[i][0]) for i in idx)
        width = min(max_len, 1 << max(3, math.ceil(math.log2(width))))  # few distinct shapes to compile
        tok = np.zeros((batch_size, width), np.int32)
        tgt = np.zeros((batch_size, width), np.int32)
        mask = np.zeros((batch_size, width), np.float32)
        for r, i in enumerate(idx):
            inp, target, n_cont = rows[i]
            tok[r, :len(inp)], tgt[r, :len(inp)] = inp, target
            mask[r, len(inp) - n_cont:len(inp)] = 1.0
        ll = _batch_loglik(model.params, jnp.asarray(tok), jnp.asarray(tgt), jnp.asarray(mask), cfg, dispatch)
        out[idx] = np.asarray(ll, np.float64)[:len(idx)]
    return out


def _stderr(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def score_task(model: Model, encode: Encode, items: Sequence[ChoiceItem], batch_size: int = 32
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-item rows) of one task."""
    pairs = [encode_pair(encode, it.context, c) for it in items for c in it.choices]
    lls = score_pairs(model, pairs, batch_size)
    rows, k = [], 0
    for it in items:
        ll = lls[k:k + len(it.choices)]
        ntok = [len(p[1]) for p in pairs[k:k + len(it.choices)]]
        k += len(it.choices)
        chars = np.array([len(c) for c in it.choices], np.float64)
        nbytes = np.array([len(c.encode("utf-8")) for c in it.choices], np.float64)
        rows.append({**it.extra, "gold": it.gold, "pred": int(np.argmax(ll)),
                     "pred_norm": int(np.argmax(ll / chars)), "pred_bytes": int(np.argmax(ll / nbytes)),
                     "loglik": [float(x) for x in ll], "tokens": ntok})
    chance = float(np.mean([1 / len(it.choices) for it in items]))
    summary: dict[str, Any] = {"items": len(rows), "chance": chance}
    for metric, key in (("acc", "pred"), ("acc_norm", "pred_norm"), ("acc_bytes", "pred_bytes")):
        hits = np.array([float(r[key] == r["gold"]) for r in rows])
        summary[metric], summary[f"{metric}_stderr"] = float(hits.mean()), _stderr(hits)
    return summary, rows


def load_encoder(tokenizer: str) -> Encode:
    """``text -> ids`` without special tokens, from a tokenizer.json or a directory holding one."""
    from tokenizers import Tokenizer

    path = tokenizer if tokenizer.endswith(".json") else f"{tokenizer.rstrip('/')}/tokenizer.json"
    with fsspec.open(path, "r", encoding="utf-8") as f:
        tok = Tokenizer.from_str(f.read())
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _task_files(config: EvaluateChoicesConfig) -> dict[str, str]:
    names = config.tasks or shipped_tasks()
    return {(t.rsplit("/", 1)[-1].removesuffix(".jsonl") if t.endswith(".jsonl") else t):
            (t if t.endswith(".jsonl") else task_path(t)) for t in names}


def evaluate_choices(config: EvaluateChoicesConfig) -> dict[str, Any]:
    """Score every task; write choices.json and items/<task>.jsonl; return choices.json's content."""
    t0 = time.time()
    model = load_checkpoint(config.checkpoint)
    encode = load_encoder(config.tokenizer)
    out = config.output_path.rstrip("/")
    tasks: dict[str, Any] = {}
    for name, path in _task_files(config).items():
        items = read_task(path, config.max_items)
        summary, rows = score_task(model, encode, items, config.batch_size)
        tasks[name] = {**summary, "file": path}
        write_bytes_atomic(f"{out}/items/{name}.jsonl",
                           "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
        print(f"[evaluate_choices] {name}: acc {summary['acc']:.3f} ± {summary['acc_stderr']:.3f}, acc_norm "
              f"{summary['acc_norm']:.3f} ± {summary['acc_norm_stderr']:.3f} over {len(rows)} items "
              f"(chance {summary['chance']:.3f})", file=sys.stderr, flush=True)
    result = {"tasks": tasks, "checkpoint": config.checkpoint, "wall_s": time.time() - t0,
              "conventions": {"tokenization": "lm-eval _encode_pair (causal), no special tokens",
                              "acc_norm": "loglik / characters", "acc_bytes": "loglik / UTF-8 bytes",
                              "stderr": "sample std / sqrt(n)",
                              "truncation": f"left, {model.config.max_seq_len}"}}
    write_json_atomic(f"{out}/choices.json", result)
    return result


__all__ = ["ChoiceItem", "EvaluateChoicesConfig", "encode_pair", "evaluate_choices", "load_encoder",
           "read_task",
           "score_pairs", "score_task"]
