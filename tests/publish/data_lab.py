"""Real tiny runs for the site's browser test: marin.compare's lab (a baseline and an ablation, with a
scaling-law fit and a forecast planted as tests/dashboard/test_compare_view.py does) and a data experiment
(ingest -> decontaminate -> train tokenizer -> tokenize by domain -> train on a two-stage mixture, the real
operators on a small stdlib + pydoc corpus with one planted evaluation leak) whose records make the data
cards."""

from __future__ import annotations

import json
from pathlib import Path

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from operators.decontaminate import DecontaminateConfig, EvalSet, decontaminate
from operators.ingest import IngestConfig, Source, _in_validation, ingest
from operators.tokenize import TokenizeConfig, tokenize
from operators.train import MixtureStage, TrainConfig, train
from operators.train_tokenizer import TrainTokenizerConfig, train_tokenizer
from tests.compare.lab import lab_prefix
from tests.compare.test_fitplot import RECORD, fit_doc
from tests.operators.conftest import write_corpus
from tests.operators.test_decontaminate import QUESTION

LEAK_MARK = "An unrelated preface about arithmetic practice"
"""The planted leaked training document's own words: no data card may show them (never raw documents)."""
TINY_MODEL = {"vocab_size": 512, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8,
              "d_ff": 32, "n_experts": 4, "top_k": 2, "expert_d_ff": 16, "n_shared_experts": 1,
              "shared_d_ff": 16}


def run_data(prefix: str, corpus: Path) -> str:
    ingest_config = IngestConfig(
        sources=(Source("python", (str(corpus / "code" / "*.py"),)),
                 Source("prose", (str(corpus / "topics.jsonl"), str(corpus / "bundle.jsonl")), kind="jsonl")),
        output_path=this_output_path(), validation_fraction=0.2, shard_bytes=60_000)
    # one prose document holding an evaluation item, worded so that it lands in the train split
    text = next(t for n in range(100) if not _in_validation(
        t := f"{LEAK_MARK}.\n\n{QUESTION}\n\nAn unrelated afterword ({n}).", ingest_config))
    (corpus / "bundle.jsonl").write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    evals = corpus / "gsm8k_sample.jsonl"
    evals.write_text(json.dumps({"text": QUESTION}) + "\n", encoding="utf-8")
    documents = Step(name="data/tiny-docs", fn=ingest, config=ingest_config)
    clean = Step(name="data/tiny-clean", fn=decontaminate, config=DecontaminateConfig(
        input_path=output_path_of(documents), eval_sets=(EvalSet("gsm8k", str(evals)),),
        output_path=this_output_path(), max_contamination=1.0))
    tok = Step(name="data/tiny-tokenizer", fn=train_tokenizer, config=TrainTokenizerConfig(
        output_path=this_output_path(), input_path=output_path_of(clean), vocab_size=512))
    cache = Step(name="data/tiny-tokens", fn=tokenize, config=TokenizeConfig(
        input_path=output_path_of(clean), tokenizer_path=output_path_of(tok),
        output_path=this_output_path(), num_workers=1, backend="processes", train_by_domain=True))
    mix = Step(name="train/tiny-mixture", fn=train, config=TrainConfig(
        output_path=this_output_path(), train_cache=output_path_of(cache, "train"), preset="tiny",
        model=TINY_MODEL, mixture={"python": 0.7, "prose": 0.3},
        mixture_stages=(MixtureStage(2, {"python": 0.5, "prose": 0.5}),),
        overrides={"schedule.warmup_steps": 1}, num_steps=4, batch_size=2, seq_len=16, checkpoint_every=4,
        wandb_mode="disabled", progress_bar=False))
    result = run_experiment([mix], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="experiments/exp95_tiny_data.py", description="tiny data card")
    assert result.status == "SUCCESS", result.summary
    return str(result.experiment_id)


def write_site_lab(root: Path) -> tuple[str, str, str]:
    """The lab under root/lab; returns (prefix, ablation id, data experiment id)."""
    prefix = str(root / "lab")
    base, ablation = lab_prefix(prefix)
    manifest = json.loads(Path(prefix, "experiments", f"{base}.json").read_text())
    steps = {s["name"]: s["output_path"] for s in manifest["steps"]}
    record = json.loads(RECORD.read_text())
    Path(steps["train/tiny"], "fit.json").write_text(json.dumps(fit_doc(record["points"][-1]["params"])))
    Path(steps["eval/tiny"], "prediction.json").write_text(RECORD.read_text())
    data = run_data(prefix, write_corpus(root / "corpus"))
    return prefix, ablation, data
