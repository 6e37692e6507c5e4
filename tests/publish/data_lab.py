"""Real tiny runs for the site's browser test: marin.compare's lab (a baseline and an ablation, with a
scaling-law fit and a forecast planted as tests/dashboard/test_compare_view.py does) and a data experiment
(ingest -> train tokenizer -> tokenize, the real operators on a small stdlib + pydoc corpus) whose records
make the data card."""

from __future__ import annotations

import json
from pathlib import Path

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from operators.ingest import IngestConfig, Source, ingest
from operators.tokenize import TokenizeConfig, tokenize
from operators.train_tokenizer import TrainTokenizerConfig, train_tokenizer
from tests.compare.lab import lab_prefix
from tests.compare.test_fitplot import RECORD, fit_doc
from tests.operators.conftest import write_corpus


def run_data(prefix: str, corpus: Path) -> str:
    documents = Step(name="data/tiny-docs", fn=ingest, config=IngestConfig(
        sources=(Source("python", (str(corpus / "code" / "*.py"),)),
                 Source("prose", (str(corpus / "topics.jsonl"),), kind="jsonl")),
        output_path=this_output_path(), validation_fraction=0.2, shard_bytes=60_000))
    tok = Step(name="data/tiny-tokenizer", fn=train_tokenizer, config=TrainTokenizerConfig(
        output_path=this_output_path(), input_path=output_path_of(documents), vocab_size=512))
    cache = Step(name="data/tiny-tokens", fn=tokenize, config=TokenizeConfig(
        input_path=output_path_of(documents), tokenizer_path=output_path_of(tok),
        output_path=this_output_path(), num_workers=1, backend="processes"))
    result = run_experiment([cache], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="experiments/exp95_tiny_data.py", description="tiny data card")
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
