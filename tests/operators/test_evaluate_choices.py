"""evaluate_choices: lm-eval's pair encoding, batched scoring against one-by-one scoring, bad task files, the
shipped tasks, and parity with lm-evaluation-harness on a trained model exported to the Hugging Face
format."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_trainer.checkpoint import load_checkpoint
from moe_trainer.config import ModelConfig
from moe_trainer.model import Model, forward, init_params
from operators.evaluate_choices import (
    EvaluateChoicesConfig,
    encode_pair,
    evaluate_choices,
    load_encoder,
    read_task,
    score_pairs,
)
from operators.export_hf import ExportHfConfig, export_hf
from operators.ingest import IngestConfig
from operators.tasks import TASKS_DIR, shipped_tasks, task_path
from operators.tasks.build import SALT, write_tasks
from operators.tokenize import TokenizeConfig, tokenize
from operators.train import TrainConfig, train

SEQ = 96  # the trained model's context: long enough for every shipped item, short enough to train fast


def test_encode_pair_is_lm_evals() -> None:
    from lm_eval.api.model import TemplateLM

    def encode(text: str) -> list[int]:  # a toy tokenizer that merges a space with the next word's first byte
        out, i = [], 0
        while i < len(text):
            if text[i] == " " and i + 1 < len(text):
                out.append(1000 + ord(text[i + 1]))
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    fake = SimpleNamespace(backend="causal", tok_encode=encode)
    for ctx, cont in [("The cat", " sat"), ("The cat ", "sat"), ("a\n", "b"), ("x  ", " y z")]:
        assert encode_pair(encode, ctx, cont) == TemplateLM._encode_pair(fake, ctx, cont)  # type: ignore[arg-type]
    # Trailing whitespace moves into the continuation, so the merged " s" token is scored as the choice's.
    assert encode_pair(encode, "The cat ", "sat") == (
        encode("The cat"),
        [1000 + ord("s"), ord("a"), ord("t")],
    )


def test_batched_scores_equal_one_by_one_scores() -> None:
    # A dense model: this checks batching, padding, masking and truncation (MoE: the parity test).
    cfg = ModelConfig(
        vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, max_seq_len=12
    )
    model = Model(cfg, init_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(0)
    pairs = [
        (list(rng.integers(1, 50, n)), list(rng.integers(1, 50, m)))
        for n, m in [(1, 1), (3, 2), (5, 4), (2, 7), (11, 3), (14, 2)]
    ]  # the last two are left-truncated to 12 inputs
    got = score_pairs(model, pairs, batch_size=4)
    logits_of = jax.jit(lambda p, t: forward(p, t, cfg, capacity_factor=None)[0])
    for (ctx, cont), ll in zip(pairs, got, strict=True):
        seq = (ctx + cont)[-(cfg.max_seq_len + 1) :]
        logits = logits_of(model.params, jnp.asarray([seq[:-1]], jnp.int32))
        logp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1), np.float64)
        want = sum(logp[t, seq[t + 1]] for t in range(len(seq) - 1 - len(cont), len(seq) - 1))
        assert ll == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"context": "", "choices": ["a", "b"], "gold": 0}', "context is missing or empty"),
        ('{"context": "c", "choices": ["a"], "gold": 0}', "choices must be a list of at least two"),
        ('{"context": "c", "choices": ["a", "b"], "gold": 2}', "gold=2 is not an index into the 2 choices"),
    ],
    ids=["json", "context", "choices", "gold"],
)
def test_bad_task_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"context": "c", "choices": ["a", "b"], "gold": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"t.jsonl:2: {message}"):
        read_task(str(path))


def test_unknown_task_name_lists_the_shipped_ones() -> None:
    with pytest.raises(
        ValueError, match="no shipped task named 'hellaswag': choose one of pydoc_next_sentence_v1"
    ):
        EvaluateChoicesConfig(output_path="o", checkpoint="c", tokenizer="t", tasks=("hellaswag",))


def test_shipped_tasks_are_valid_and_rebuild_identically(tmp_path: Path) -> None:
    meta = json.loads((TASKS_DIR / "tasks.json").read_text())
    assert IngestConfig.__dataclass_fields__["split_salt"].default == SALT, (
        "the tasks must follow ingest's split"
    )
    for name in shipped_tasks():
        items = read_task(task_path(name))
        assert len(items) == meta["tasks"][name]["items"] >= 100
        assert all(not it.context[-1].isspace() and len(set(it.choices)) == 4 for it in items)
    if meta["python"] != ".".join(map(str, sys.version_info[:3])):
        pytest.skip(
            f"tasks were built from Python {meta['python']}'s stdlib, this is {sys.version.split()[0]}"
        )
    write_tasks(tmp_path)
    for name in shipped_tasks():
        assert (tmp_path / f"{name}.jsonl").read_bytes() == Path(task_path(name)).read_bytes(), name


@pytest.fixture(scope="module")
def trained(dataset: str, tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("choices")
    tok = str(root / "tokenized")
    tokenize(TokenizeConfig(input_path=dataset, tokenizer_path=tokenizer_dir, output_path=tok, num_workers=1))
    vocab = json.loads(Path(tokenizer_dir, "tokenizer_info.json").read_text())["vocab_size"]
    model = {
        "vocab_size": vocab,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "n_kv_heads": 1,
        "head_dim": 16,
        "d_ff": 64,
        "n_experts": 4,
        "top_k": 2,
        "expert_d_ff": 32,
        "n_shared_experts": 0,
    }  # Qwen3-MoE-exportable
    run = str(root / "train")
    train(
        TrainConfig(
            output_path=run,
            train_cache=f"{tok}/train",
            preset="tiny",
            model=model,
            num_steps=40,
            batch_size=8,
            seq_len=SEQ,
            # Marin's MoE recipe (MuonH / AdamH / Adam), so this run also exercises it through train().
            overrides={"schedule.warmup_steps": 4, "optimizer.name": "muonh", "optimizer.hyperball_lr": 0.02,
                       "optimizer.lr": 0.004},
            progress_bar=False,
            wandb_mode="disabled",
        )
    )
    return {"run": run, "tokenizer": tokenizer_dir, "root": str(root)}


def _lm_eval_task_yaml(directory: Path, name: str, path: str) -> None:
    (directory / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
""")


def _run_lm_eval(hf_dir: str, tasks: dict[str, str], root: Path) -> dict[str, Any]:
    yaml_dir, out = root / "lm_eval_tasks", root / "lm_eval_out"
    yaml_dir.mkdir()
    for name, path in tasks.items():
        _lm_eval_task_yaml(yaml_dir, name, path)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(root / "hf_home"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={hf_dir},dtype=float32,add_bos_token=False,max_length={SEQ}",
        "--tasks",
        ",".join(tasks),
        "--include_path",
        str(yaml_dir),
        "--output_path",
        str(out),
        "--log_samples",
        "--device",
        "cpu",
        "--batch_size",
        "16",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(Path(sorted(glob.glob(f"{out}/**/results_*.json", recursive=True))[-1]).read_text())
    samples = {}
    for name in tasks:
        (path,) = glob.glob(f"{out}/**/samples_{name}_*.jsonl", recursive=True)
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        samples[name] = sorted(rows, key=lambda r: r["doc_id"])
    return {"results": results["results"], "samples": samples}


@pytest.mark.slow
def test_lm_eval_harness_parity(trained: dict[str, str]) -> None:
    root = Path(trained["root"])
    ours = evaluate_choices(
        EvaluateChoicesConfig(
            output_path=str(root / "choices"), checkpoint=trained["run"], tokenizer=trained["tokenizer"]
        )
    )
    hf_dir = str(root / "hf")
    export_hf(ExportHfConfig(output_path=hf_dir, checkpoint=trained["run"], tokenizer=trained["tokenizer"]))
    theirs = _run_lm_eval(hf_dir, {n: task_path(n) for n in shipped_tasks()}, root)
    encode = load_encoder(trained["tokenizer"])
    assert load_checkpoint(trained["run"]).config.max_seq_len == SEQ
    for name in shipped_tasks():
        rows = [
            json.loads(line)
            for line in (root / "choices" / "items" / f"{name}.jsonl").read_text().splitlines()
        ]
        samples = theirs["samples"][name]
        assert len(rows) == len(samples) == ours["tasks"][name]["items"]
        margins = []
        for row, sample in zip(rows, samples, strict=True):
            lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
            # The same tokens on both sides: lm-eval's request arguments re-encoded with our rule.
            args = [sample["arguments"][f"gen_args_{i}"] for i in range(len(sample["arguments"]))]
            ctx, conts = args[0]["arg_0"], [a["arg_1"] for a in args]
            assert [len(encode_pair(encode, ctx, c)[1]) for c in conts] == row["tokens"]
            np.testing.assert_allclose(
                row["loglik"], lls, rtol=1e-4, atol=2e-4, err_msg=f"{name} {row['id']}"
            )
            assert row["pred"] == int(np.argmax(lls)), f"{name} {row['id']}: {row['loglik']} vs {lls}"
            assert float(row["pred"] == row["gold"]) == sample["acc"]
            assert float(row["pred_norm"] == row["gold"]) == sample["acc_norm"]
            assert float(row["pred_bytes"] == row["gold"]) == sample["acc_bytes"]
            margins.append(np.sort(lls)[-1] - np.sort(lls)[-2])
        res = theirs["results"][name]
        for metric in ("acc", "acc_norm", "acc_bytes"):
            assert ours["tasks"][name][metric] == pytest.approx(res[f"{metric},none"], abs=1e-12)
            assert ours["tasks"][name][f"{metric}_stderr"] == pytest.approx(
                res[f"{metric}_stderr,none"], rel=1e-9
            )
        # For the record (docs/evaluation.md): a near-tie is where two float32 implementations could disagree.
        print(f"{name}: acc {ours['tasks'][name]['acc']:.3f}, smallest top-2 margin {min(margins):.2e} nats")


def test_the_muonh_run_kept_every_hyperball_matrix_norm(trained: dict[str, str]) -> None:
    """train() with optimizer.name=muonh: each MuonH/AdamH matrix (per expert) ends at its initial norm."""
    from moe_trainer import optim
    from moe_trainer.params import param_logical_axes

    model = load_checkpoint(trained["run"])
    cfg = model.config
    init = init_params(cfg, jax.random.key(0))  # train() initialises from key(seed), seed 0
    logical = param_logical_axes(cfg)
    labels = optim.param_labels(init, optim.OptimizerConfig(name="muonh"), logical)
    names = jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, tuple))
    leaves = (jax.tree.leaves(labels), names, jax.tree.leaves(init), jax.tree.leaves(model.params))
    flat = zip(*leaves, strict=True)
    checked = 0
    for label, dims, before, after in flat:
        if label in ("muonh", "adamh"):
            b, a = np.asarray(before), np.asarray(after)
            axes = (-2, -1) if dims[0] == "experts" else None  # one radius per expert
            np.testing.assert_allclose(np.linalg.norm(a, axis=axes), np.linalg.norm(b, axis=axes), rtol=1e-4)
            assert not np.allclose(a, b), "the matrix must have moved"
            checked += 1
    assert checked == 2 * (4 + 3) + 1  # per layer wq wk wv wo and w_gate w_up w_down (MuonH); lm_head (AdamH)
