"""The train and evaluate operators: bits per byte against a hand computation, dropless evaluation, resume
after an interrupted attempt, config errors, and which fields count for the step's identity."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import draccus
import jax
import numpy as np
import pytest

from moe_trainer.checkpoint import CheckpointConfig, Checkpointer, load_checkpoint
from moe_trainer.config import ModelConfig
from moe_trainer.data.cache import CacheHeader, CacheWriter, write_shard
from moe_trainer.evaluate import evaluate as trainer_evaluate
from moe_trainer.model import init_params
from moe_trainer.train import train as trainer_train
from operators.evaluate import EvaluateConfig, evaluate
from operators.train import TrainConfig, train, trainer_config

VOCAB, EOS = 64, 0
TEXTS = {
    "alpha": ["def f(x):\n    return x + 1\n", "naïve café — ünïcode 🙂", "a", "    \n\t  spaces\n"],
    "beta": ["The quick brown fox jumps over the lazy dog.", "日本語のテキスト",
             "x = [i * i for i in range(9)]"],
}


def toy_ids(text: str) -> list[int]:
    """A toy tokenizer: one token per UTF-8 byte, ids in [1, VOCAB) (0 is EOS)."""
    return [b % (VOCAB - 1) + 1 for b in text.encode("utf-8")]


def write_cache(path: str, domain: str, texts: list[str], shards: int = 2) -> str:
    header = CacheHeader(tokenizer={"name": "toy-bytes"}, vocab_size=VOCAB, eos_id=EOS)
    writer = CacheWriter(path, header)
    names = []
    for k in range(shards):
        docs = [(toy_ids(t), domain, len(t.encode("utf-8"))) for t in texts[k::shards]]
        names.append(f"{k:05d}")
        write_shard(path, names[-1], header, docs)
    writer.write_manifest(names)
    return path


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("caches")
    return {d: write_cache(str(root / d), d, texts) for d, texts in TEXTS.items()}


def save_checkpoint(directory: Path, cfg: ModelConfig, params: Any) -> str:
    ckpt = Checkpointer(str(directory / "checkpoints"), CheckpointConfig(async_save=False))
    ckpt.save(1, {"params": params}, {"model_config": draccus.encode(cfg)})
    ckpt.close()
    return str(directory)


def toy_config(**changes: Any) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32,
                n_experts=4, top_k=2, expert_d_ff=16, max_seq_len=8)
    return ModelConfig(**{**base, **changes})


def bigram_params(cfg: ModelConfig) -> Any:
    """Parameters whose logits depend on the input token only: every block's output projection is zero, so
    the residual stream is the input's embedding, and logits = rmsnorm(embed[x]) * final_norm @ lm_head."""
    params = init_params(cfg, jax.random.key(3))
    rng = np.random.default_rng(0)
    layer = params["layers"][0]
    layer["attn"]["wo"] = np.zeros_like(layer["attn"]["wo"])
    layer["moe"]["w_down"] = np.zeros_like(layer["moe"]["w_down"])
    params["embed"] = rng.normal(size=params["embed"].shape).astype(np.float32)
    params["final_norm"] = rng.uniform(0.5, 1.5, size=params["final_norm"].shape).astype(np.float32)
    params["lm_head"] = rng.normal(scale=0.7, size=params["lm_head"].shape).astype(np.float32)
    return jax.tree.map(np.asarray, params)


def hand_token_nll(params: Any, cfg: ModelConfig, texts: list[str]) -> np.ndarray:
    """Every target's NLL in nats, computed with numpy in float64, independently of the trainer.

    The stream is [EOS] + each document followed by its EOS; every token after the first is a target once,
    predicted from the token before it."""
    stream = [EOS]
    for t in texts:
        stream += [*toy_ids(t), EOS]
    inputs, targets = np.array(stream[:-1]), np.array(stream[1:])
    h = np.asarray(params["embed"], np.float64)[inputs]
    h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + cfg.norm_eps) * np.asarray(params["final_norm"])
    logits = h @ np.asarray(params["lm_head"], np.float64)
    top = logits.max(axis=-1)
    logz = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
    return np.asarray(logz - logits[np.arange(len(targets)), targets])


def hand_nll(params: Any, cfg: ModelConfig, texts: list[str]) -> tuple[float, int, int]:
    """(summed NLL in nats, tokens, bytes), from hand_token_nll."""
    nll = hand_token_nll(params, cfg, texts)
    return float(nll.sum()), len(nll), sum(len(t.encode("utf-8")) for t in texts)


def test_eval_bits_per_byte_equals_hand_computation(caches: dict[str, str], tmp_path: Path) -> None:
    cfg = toy_config()
    params = bigram_params(cfg)
    ckpt = save_checkpoint(tmp_path / "run", cfg, params)
    out = tmp_path / "eval"
    result = evaluate(EvaluateConfig(output_path=str(out), checkpoint=ckpt, validation=caches, batch_size=3))
    assert json.loads((out / "eval.json").read_text()) == result
    sums = {}
    for domain, texts in TEXTS.items():
        nll, tokens, nbytes = hand_nll(params, cfg, texts)
        sums[domain] = (nll, tokens, nbytes)
        row = result["domains"][domain]
        assert (row["tokens"], row["bytes"]) == (tokens, nbytes)
        assert row["loss"] == pytest.approx(nll / tokens, rel=1e-5)
        assert row["bpb"] == pytest.approx(nll / (math.log(2) * nbytes), rel=1e-5)
    nll, tokens, nbytes = (sum(col) for col in zip(*sums.values(), strict=True))
    assert result["micro"]["bpb"] == pytest.approx(nll / (math.log(2) * nbytes), rel=1e-5)
    assert (result["micro"]["tokens"], result["micro"]["bytes"]) == (tokens, nbytes)
    assert result["macro"]["bpb"] == pytest.approx(np.mean([r["bpb"] for r in result["domains"].values()]))
    # a uniform model would score log2(64) * tokens / bytes; the toy model is far from it, so the match above
    # is not an accident of the byte count
    assert abs(result["micro"]["bpb"] - math.log2(VOCAB) * tokens / nbytes) > 0.1
    info = json.loads((out / "eval_info.json").read_text())
    assert info["dropless"] and info["seq_len"] == cfg.max_seq_len


def hand_document_sums(params: Any, cfg: ModelConfig, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(summed NLL, targets) per document: document d's targets are its tokens and its EOS."""
    per_token = hand_token_nll(params, cfg, texts)
    bounds = np.cumsum([0, *(len(toy_ids(t)) + 1 for t in texts)])
    return (np.array([per_token[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]),
            np.diff(bounds).astype(np.float64))


def test_eval_standard_error_takes_documents_as_the_units(caches: dict[str, str], tmp_path: Path) -> None:
    """eval.json's bpb_stderr/loss_stderr per domain: the standard error of the summed NLL over documents
    (ratio-estimator residuals nll_d - loss * tokens_d), computed here by hand; macro's is that of the mean of
    independent domains. Windows of 8 tokens cut documents, so a per-window figure would differ."""
    cfg = toy_config()
    params = bigram_params(cfg)
    ckpt = save_checkpoint(tmp_path / "run", cfg, params)
    result = evaluate(EvaluateConfig(output_path=str(tmp_path / "eval"), checkpoint=ckpt, validation=caches,
                                     batch_size=3))
    for domain, texts in TEXTS.items():
        y, x = hand_document_sums(params, cfg, texts)
        n, loss = len(texts), y.sum() / x.sum()
        se_sum = math.sqrt(n / (n - 1) * ((y - loss * x) ** 2).sum())
        row = result["domains"][domain]
        assert row["documents"] == n >= 2 and x.sum() == row["tokens"]
        assert row["loss_stderr"] == pytest.approx(se_sum / x.sum(), rel=1e-4)
        assert row["bpb_stderr"] == pytest.approx(se_sum / (math.log(2) * row["bytes"]), rel=1e-4)
        assert 0 < row["bpb_stderr"] < row["bpb"]
    ses = [r["bpb_stderr"] for r in result["domains"].values()]
    assert result["macro"]["bpb_stderr"] == pytest.approx(math.sqrt(sum(se ** 2 for se in ses)) / len(ses))
    assert "bpb_stderr" not in result["micro"]  # domains differ in bytes per token: no pooled figure


def test_eval_is_dropless_even_for_a_capacity_limited_model(caches: dict[str, str], tmp_path: Path) -> None:
    cfg = toy_config(capacity_factor=0.25)
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(1)))
    ckpt = save_checkpoint(tmp_path / "run", cfg, params)
    result = evaluate(EvaluateConfig(output_path=str(tmp_path / "eval"), checkpoint=ckpt, validation=caches))
    model = load_checkpoint(ckpt)
    dropless = trainer_evaluate(model, caches, capacity_factor=None)
    capped = trainer_evaluate(model, caches, capacity_factor="config")
    assert result == dropless
    assert capped["micro"]["loss"] != pytest.approx(dropless["micro"]["loss"], rel=1e-6)


def test_eval_finds_the_validation_caches_of_a_tokenize_step(caches: dict[str, str], tmp_path: Path) -> None:
    tokenized = tmp_path / "tokenized"
    tokenized.mkdir()
    (tokenized / "tokenize.json").write_text(json.dumps({"validation": {"alpha": "../caches-alpha"}}))
    (tmp_path / "caches-alpha").symlink_to(caches["alpha"])
    cfg = toy_config()
    ckpt = save_checkpoint(tmp_path / "run", cfg, bigram_params(cfg))
    result = evaluate(EvaluateConfig(output_path=str(tmp_path / "eval"), checkpoint=ckpt,
                                     tokenized=str(tokenized),
                                     validation={"beta": caches["beta"]}))
    assert sorted(result["domains"]) == ["alpha", "beta"]
    with pytest.raises(FileNotFoundError, match="tokenize.json is missing"):
        evaluate(EvaluateConfig(output_path=str(tmp_path / "e2"), checkpoint=ckpt, tokenized=str(tmp_path)))
    with pytest.raises(ValueError, match="give validation caches"):
        EvaluateConfig(output_path=str(tmp_path / "e3"), checkpoint=ckpt)


@pytest.fixture(scope="module")
def train_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "return", "def", "(x)", ":", "\n", "    "]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(20, 60)))) for _ in range(40)]
    return write_cache(str(tmp_path_factory.mktemp("train-cache")), "toy", texts, shards=3)


def small_train(output: Path, train_cache: str, **changes: Any) -> TrainConfig:
    fields: dict[str, Any] = dict(
        model={"vocab_size": VOCAB, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
               "head_dim": 8,
               "d_ff": 32, "n_experts": 4, "top_k": 2, "expert_d_ff": 16, "n_shared_experts": 1,
               "shared_d_ff": 16},
        overrides={"schedule.warmup_steps": 2, "matmul_precision": "highest"},
        num_steps=6, batch_size=2, seq_len=16, checkpoint_every=2, wandb_mode="disabled", progress_bar=False)
    return TrainConfig(output_path=str(output), train_cache=train_cache, preset="tiny",
                       **{**fields, **changes})


def metrics_rows(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_train_resumes_from_its_own_latest_checkpoint(train_cache: str, tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    full = train(small_train(whole, train_cache, wandb_mode="offline"))
    assert full["step"] == 6
    assert json.loads((whole / "wandb.json").read_text())["mode"] == "offline"
    assert json.loads((whole / "train_config.json").read_text())["num_steps"] == 6

    # An attempt that was preempted after step 3: its checkpoint at step 3 is on storage, and it had logged a
    # row for step 4 whose checkpoint never became durable.
    cut = tmp_path / "cut"
    config = small_train(cut, train_cache)
    trainer_train(dataclasses.replace(trainer_config(config), run_steps=3))
    before = metrics_rows(cut)
    assert [r["step"] for r in before] == [1, 2, 3]
    with open(cut / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**before[-1], "step": 4, "loss": 999.0}) + "\n")

    resumed = train(config)  # the executor's retry: same config, same output path
    rows = metrics_rows(cut)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["time"] for r in rows[:3]] == [r["time"] for r in before]  # steps 1-3 were not redone
    reference = metrics_rows(whole)
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in reference], rtol=1e-6)
    assert resumed["step"] == 6 and resumed["loss"] == pytest.approx(full["loss"], rel=1e-6)
    a, b = load_checkpoint(str(whole)), load_checkpoint(str(cut))
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_train_config_builds_from_preset_and_overrides(train_cache: str, tmp_path: Path) -> None:
    tc = trainer_config(small_train(tmp_path / "run", train_cache, data_seed=5, seed=2))
    assert (tc.model.d_model, tc.model.vocab_size, tc.model.max_seq_len) == (16, VOCAB, 16)
    assert (tc.data.batch_size, tc.data.seq_len, tc.data.seed, tc.seed) == (2, 16, 5, 2)
    assert tc.schedule.warmup_steps == 2 and tc.checkpoint.every_steps == 2 and tc.num_steps == 6
    assert tc.output_dir == str(tmp_path / "run") and tc.metrics.wandb_mode == "disabled"
    # fields validated together change together: 3 heads need n_kv_heads to divide 3 (the preset has 2)
    heads = trainer_config(dataclasses.replace(small_train(tmp_path / "r3", train_cache),
                                               model={"n_heads": 3, "n_kv_heads": 1}))
    assert (heads.model.n_heads, heads.model.n_kv_heads) == (3, 1)
    whole_model = trainer_config(dataclasses.replace(small_train(tmp_path / "r2", train_cache),
                                                     model=toy_config()))
    assert whole_model.model.n_experts == 4 and whole_model.model.max_seq_len == 16


@pytest.mark.parametrize("changes, message", [
    ({"overrides": {"optimizer.learning_rate": 0.1}},
     "OptimizerConfig has no field 'learning_rate'; valid fields"),
    ({"overrides": {"num_steps.x": 1}}, "not a config with fields"),
    ({"model": {"n_expert": 3}}, "ModelConfig has no field 'n_expert'"),
    ({"preset": "no-such-preset"}, "unknown preset 'no-such-preset'; valid presets"),
], ids=["unknown-override", "not-nested", "unknown-model-field", "unknown-preset"])
def test_train_config_errors_name_the_field(train_cache: str, tmp_path: Path, changes: dict[str, Any],
                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trainer_config(dataclasses.replace(small_train(tmp_path / "run", train_cache), **changes))


def test_train_refuses_a_model_vocabulary_smaller_than_the_cache(train_cache: str, tmp_path: Path) -> None:
    config = small_train(tmp_path / "run", train_cache)
    config = dataclasses.replace(config, model={**config.model, "vocab_size": 32})
    with pytest.raises(ValueError, match="vocab_size 64 but the model has 32"):
        train(config)
    with pytest.raises(ValueError, match="num_steps=0 must be >= 1"):
        dataclasses.replace(config, num_steps=0)


def test_runtime_fields_do_not_change_the_step_identity(train_cache: str) -> None:
    from marin import Step, this_output_path
    from marin.graph.dag import build_graph

    def step_hash(**changes: Any) -> str:
        config = dataclasses.replace(small_train(Path("unused"), train_cache), output_path=this_output_path(),
                                     **changes)
        return build_graph([Step(name="train/toy", fn=train, config=config)]).nodes[0].hash

    base = step_hash()
    assert step_hash(wandb_mode="offline", checkpoint_every=3, progress_bar=True) == base
    assert step_hash(num_steps=7) != base
    assert step_hash(data_seed=1) != base
    assert step_hash(overrides={"optimizer.lr": 0.01}) != base


def test_train_evaluates_during_training_when_given_validation_caches(train_cache: str,
                                                                      caches: dict[str, str],
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train(small_train(out, train_cache, num_steps=4, validation=caches, eval_every=2,
                               eval_max_batches=1))
    evals = [r for r in metrics_rows(out) if "eval" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert sorted(evals[-1]["eval"]["domains"]) == ["alpha", "beta"]
    assert result["eval"] == evals[-1]["eval"] == json.loads((out / "eval.json").read_text())


def test_train_on_a_two_source_mixture_with_a_stage(caches: dict[str, str], train_cache: str,
                                                     tmp_path: Path) -> None:
    """Sources under train_cache by name (tokenize's train_by_domain layout) plus one named explicitly; the
    per-source token counts are in metrics.jsonl, and the stage turns the second source on at step 2."""
    from operators.train import MixtureStage

    root = tmp_path / "train"
    root.mkdir()
    (root / "alpha").symlink_to(caches["alpha"], target_is_directory=True)
    config = small_train(tmp_path / "run", str(root), num_steps=4, mixture={"alpha": 1.0},
                         mixture_stages=(MixtureStage(2, {"alpha": 1.0, "toy": 3.0}),),
                         train_sources={"toy": train_cache})
    tc = trainer_config(config)
    assert tc.data.train_cache == ""
    assert tc.data.mixture.sources == {"alpha": f"{root}/alpha", "toy": train_cache}
    train(config)
    rows = [r for r in metrics_rows(tmp_path / "run") if "loss" in r]
    assert [(r["tokens/alpha"], r["tokens/toy"]) for r in rows[:2]] == [(32.0, 0.0), (64.0, 0.0)]
    assert rows[-1]["tokens/alpha"] + rows[-1]["tokens/toy"] == 4 * 2 * 16 and rows[-1]["tokens/toy"] > 0
    with pytest.raises(ValueError, match="need `mixture` weights"):
        small_train(tmp_path / "r", train_cache, train_sources={"toy": train_cache})


def test_a_mixture_changes_the_step_identity(train_cache: str) -> None:
    from marin import Step, this_output_path
    from marin.graph.dag import build_graph

    def step_hash(**changes: Any) -> str:
        config = dataclasses.replace(
            small_train(Path("unused"), train_cache), output_path=this_output_path(), **changes
        )
        return build_graph([Step(name="train/toy", fn=train, config=config)]).nodes[0].hash

    assert step_hash(mixture={"a": 0.5, "b": 0.5}) != step_hash(mixture={"a": 0.6, "b": 0.4}) != step_hash()


def test_a_warm_start_source_is_part_of_the_identity_and_reaches_the_trainer(
    train_cache: str, tmp_path: Path
) -> None:
    from marin import Step, output_path_of, this_output_path
    from marin.graph.dag import build_graph
    from operators.train import WarmStartConfig

    base = dataclasses.replace(small_train(Path("unused"), train_cache), output_path=this_output_path())
    source = Step(name="train/source", fn=train, config=base)
    other = Step(name="train/other-source", fn=train, config=base)

    def hashes(**changes: Any) -> str:
        warm = Step(name="train/warm", fn=train, config=dataclasses.replace(base, **changes))
        graph = build_graph([warm])
        return next(n.hash for n in graph.nodes if n.step.name == "train/warm")

    plain = hashes()
    from_source = hashes(init_from=output_path_of(source))
    assert (
        len(
            {
                plain,
                from_source,
                hashes(init_from=output_path_of(other)),
                hashes(init_from=output_path_of(source), warm_start=WarmStartConfig(optimizer_state="carry")),
            }
        )
        == 4
    )
    tc = trainer_config(
        small_train(
            tmp_path / "w",
            train_cache,
            init_from="/runs/source",
            warm_start=WarmStartConfig(data_position="carry"),
        )
    )
    assert tc.init_from == "/runs/source" and tc.warm_start.data_position == "carry"


# Each run happens in a fresh interpreter, as a user's run does. (A fork of a process whose JAX runtime is
# already started, pytest's after the in-process tests above, deadlocked in the child's first JAX call; the
# local backend now spawns its workers in such a process instead: tests/marin/test_start_method.py.)
RUN_TRAIN_THEN_EVAL = """
import dataclasses, json, sys
from pathlib import Path
from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from operators.evaluate import EvaluateConfig, evaluate
from operators.train import train
from tests.operators.test_train_eval import small_train
prefix, train_cache = sys.argv[1], sys.argv[2]
caches, forced = json.loads(sys.argv[3]), json.loads(sys.argv[4])
trained = Step(name="dmg/train", fn=train, config=dataclasses.replace(
    small_train(Path("unused"), train_cache), output_path=this_output_path()))
scored = Step(name="dmg/eval", fn=evaluate, config=EvaluateConfig(
    output_path=this_output_path(), checkpoint=output_path_of(trained), validation=caches))
config = ExecutorMainConfig(prefix=prefix, backend="local", force_run=forced or None)
result = run_experiment([scored], config, verbose=False, script="tests/experiment_under_test.py")
print("RESULT " + json.dumps({"status": result.status, "summary": result.summary,
      "paths": {n: result.output_path(n) for n in ("dmg/train", "dmg/eval")},
      "statuses": {n: result.status_of(n) for n in ("dmg/train", "dmg/eval")},
      "plan": {e.name: [e.action, e.forced] for e in result.plan.entries}}))
"""


def _run_train_then_eval(prefix: Path, train_cache: str, caches: dict[str, str],
                         force_run: list[str]) -> dict[str, Any]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RUN_TRAIN_THEN_EVAL, str(prefix), train_cache,
                          json.dumps(caches), json.dumps(force_run)],
                         capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def test_a_damaged_final_checkpoint_fails_its_evaluation_naming_the_train_step_and_force_run_repairs_it(
        caches: dict[str, str], train_cache: str, tmp_path: Path) -> None:
    """Train (checkpoints 2, 4, 6) then evaluate; the step-6 checkpoint is damaged on disk afterwards. A
    re-run of the evaluation fails in one line naming the checkpoint, the train step and `--force-run` of
    it; the train step stays SUCCESS. `--force-run` of the train step re-runs it (falling back to checkpoint
    4) and the evaluation, whose eval.json is then exactly the first one's (bit-exact resume)."""
    prefix = tmp_path / "prefix"
    first = _run_train_then_eval(prefix, train_cache, caches, [])
    assert first["status"] == "SUCCESS"
    train_path, eval_path = Path(first["paths"]["dmg/train"]), Path(first["paths"]["dmg/eval"])
    before = json.loads((eval_path / "eval.json").read_text())
    for data in [p for p in (train_path / "checkpoints/6/state").rglob("*") if p.parent.name == "d"]:
        with data.open("r+b") as f:  # every array data file loses its tail (the parameters' too)
            f.truncate(100)
    # A train step recorded with an output manifest would be re-run by the plan itself (its outputs changed
    # since success: tests/marin/test_outputs_checked.py). One recorded before manifests is trusted as it is,
    # and its damage surfaces only when the evaluation reads it: that is the path tested here.
    (train_path / ".marin/outputs.json").unlink()
    status_file = train_path / ".marin/status.json"
    status_file.write_text(json.dumps({k: v for k, v in json.loads(status_file.read_text()).items()
                                       if k != "outputs"}))

    failed = _run_train_then_eval(prefix, train_cache, caches, ["dmg/eval"])
    assert failed["status"] == "FAILED" and failed["statuses"]["dmg/train"] == "SUCCESS"
    error = json.loads((eval_path / ".marin/status.json").read_text())["error"]
    message = error["message"]
    assert error["type"] == "UnreadableCheckpointError" and error["producer"] == "dmg/train"
    assert f"checkpoint step 6 at {train_path}/checkpoints/6 cannot be read" in message
    assert "step dmg/train" in message and "`marin run SCRIPT --force-run dmg/train`" in message
    assert "\n" not in message and "TensorStore(" not in message
    assert "--force-run dmg/train" in failed["summary"]

    repaired = _run_train_then_eval(prefix, train_cache, caches, ["dmg/train"])
    assert repaired["plan"] == {"dmg/train": ["run", True], "dmg/eval": ["run", True]}
    assert repaired["status"] == "SUCCESS"
    status = json.loads((train_path / ".marin/status.json").read_text())
    assert status["attempt"] == 2 and (train_path / ".marin/logs/attempt-1.log").exists()
    result = json.loads((train_path / "train_result.json").read_text())
    [fallback] = result["checkpoint_fallbacks"]
    assert (fallback["step"], fallback["resumed_from"], fallback["steps_redone"]) == (6, 4, 2)
    assert "checkpoint step 6" in (train_path / ".marin/logs/attempt-2.log").read_text()
    # no interruption came before it: the fallback is a ledger entry of its own, as steps redone
    ledger = json.loads((train_path / ".marin/interruptions.json").read_text())
    [entry] = ledger["interruptions"]
    assert (entry["cause"], entry["attempt"], entry["steps_redone"]) == ("checkpoint_fallback", 2, 2)
    assert [f["step"] for f in entry["checkpoint_fallbacks"]] == [6] and entry["time_lost_s"] > 0
    assert ledger["totals"]["steps_redone"] == 2
    assert ledger["totals"]["by_cause"] == {"checkpoint_fallback": 1}
    assert json.loads((eval_path / "eval.json").read_text()) == before
