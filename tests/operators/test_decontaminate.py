"""decontaminate: an injected leak is caught, reported and filtered; clean data passes; eval-named files are
refused; the Bloom filter agrees with exact hashing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from operators.decontaminate import (
    ContaminationError,
    DecontaminateConfig,
    EvalSet,
    decontaminate,
    looks_like_eval_split,
)
from operators.documents import iter_documents, read_manifest
from operators.ingest import IngestConfig, Source, ingest
from operators.ngrams import BloomFilter, ngram_hashes

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? Natalia sold 48/2 = 24 clips in "
            "May. "
            "Natalia sold 48+24 = 72 clips altogether in April and May.")
OTHER_EVAL = ("Weng earns 12 dollars an hour for babysitting. Yesterday, she just did 50 minutes of "
              "babysitting. "
              "How much did she earn? Weng earns 12/60 = 0.2 dollars per minute. She earned 0.2 x 50 = 10 "
              "dollars.")


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("evalset") / "gsm8k_sample.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in (QUESTION, OTHER_EVAL, "too short")) + "\n")
    return str(path)


def _ingest(corpus: Path, out: Path, extra: Path | None = None) -> str:
    sources = [Source("python", (str(corpus / "code" / "*.py"),))]
    if extra is not None:
        sources.append(Source("math", (str(extra),)))
    ingest(IngestConfig(sources=tuple(sources), output_path=str(out), validation_fraction=0.0))
    return str(out)


def test_clean_data_passes(corpus: Path, eval_file: str, tmp_path: Path) -> None:
    clean = _ingest(corpus, tmp_path / "clean")
    report = decontaminate(DecontaminateConfig(input_path=clean, eval_sets=(EvalSet("gsm8k", eval_file),),
                                               output_path=str(tmp_path / "out")))
    r = report["eval_sets"]["gsm8k"]
    assert report["passed"] and r["contaminated_documents"] == 0 and r["contamination"] == 0.0
    assert r["documents"] == 3 and r["checked_documents"] == 2 and r["too_short_documents"] == 1
    assert report["training"] == {"documents": 24, "removed": 0, "kept": 24}
    kept = sorted(d["id"] for d in iter_documents(str(tmp_path / "out")))
    assert kept == sorted(d["id"] for d in iter_documents(clean))


def test_injected_leak_is_caught_reported_and_filtered(corpus: Path, eval_file: str, tmp_path: Path) -> None:
    leak = tmp_path / "mix" / "bundle_notes.txt"
    leak.parent.mkdir()
    # the leaked item sits inside a larger document, re-punctuated and re-cased: normalisation still finds it
    leak.write_text("Some unrelated preface about arithmetic practice.\n\n" + QUESTION.upper().replace(",",
                                                                                                       ";")
                    + "\n\nAnd an unrelated afterword.", encoding="utf-8")
    leaky = _ingest(corpus, tmp_path / "leaky", extra=leak)
    config = DecontaminateConfig(input_path=leaky, eval_sets=(EvalSet("gsm8k", eval_file),),
                                 output_path=str(tmp_path / "out"))
    with pytest.raises(ContaminationError) as err:
        decontaminate(config)
    message = str(err.value)
    assert "evaluation set 'gsm8k'" in message and "1 of 2 documents" in message
    assert "gsm8k_sample.jsonl:1" in message and "bundle_notes.txt" in message  # both sides of the overlap
    assert "To proceed" in message and "max_contamination" in message
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert not report["passed"] and report["training"]["removed"] == 1
    overlap = report["eval_sets"]["gsm8k"]["overlaps"][0]
    assert overlap["overlap"] == 1.0 and overlap["training_documents"][0]["removed"]
    # the filtered set is written either way and no longer holds the leak
    kept = list(iter_documents(str(tmp_path / "out")))
    assert len(kept) == 24 and not any("NATALIA" in d["text"] for d in kept)
    tolerant = decontaminate(DecontaminateConfig(**{**config.__dict__, "max_contamination": 0.5,
                                                    "output_path": str(tmp_path / "out2")}))
    assert tolerant["passed"] and tolerant["eval_sets"]["gsm8k"]["contamination"] == 0.5
    removed = read_manifest(str(tmp_path / "out2"))["removed_training_documents"]
    assert removed == [overlap["training_documents"][0]["id"]]


def test_a_two_source_mixture_reports_which_source_leaked(
    corpus: Path, eval_file: str, tmp_path: Path
) -> None:
    """The documents of a mixture's two sources (domains python and math): the report counts each source's
    documents and removals and names the domain of the leaking training document."""
    leak = tmp_path / "mix" / "worked_examples.txt"
    leak.parent.mkdir()
    leak.write_text(
        "Worked examples.\n\n" + QUESTION + "\n\n" + "Practice makes perfect. " * 5, encoding="utf-8"
    )
    two = _ingest(corpus, tmp_path / "two", extra=leak)
    report = decontaminate(
        DecontaminateConfig(
            input_path=two,
            eval_sets=(EvalSet("gsm8k", eval_file),),
            output_path=str(tmp_path / "out"),
            max_contamination=0.5,
        )
    )
    assert report["training_domains"] == {
        "math": {"documents": 1, "removed": 1, "kept": 0},
        "python": {"documents": 24, "removed": 0, "kept": 24},
    }
    holder = report["eval_sets"]["gsm8k"]["overlaps"][0]["training_documents"][0]
    assert holder["domain"] == "math" and holder["removed"]
    kept = {d["domain"] for d in iter_documents(str(tmp_path / "out"))}
    assert kept == {"python"}


def test_bloom_filter_method_agrees_with_exact(corpus: Path, eval_file: str, tmp_path: Path) -> None:
    leak = tmp_path / "leak.txt"
    leak.write_text("intro words here. " + OTHER_EVAL, encoding="utf-8")
    leaky = _ingest(corpus, tmp_path / "leaky", extra=leak)
    results = {}
    for method in ("exact", "bloom"):
        results[method] = decontaminate(
            DecontaminateConfig(
                input_path=leaky,
                eval_sets=(EvalSet("gsm8k", eval_file),),
                output_path=str(tmp_path / method),
                method=method,
                max_contamination=1.0,
            )
        )["eval_sets"]["gsm8k"]
    assert results["bloom"]["method"] == "bloom" and results["exact"]["method"] == "exact"
    for key in ("contaminated_documents", "removed_training_documents", "overlaps"):
        assert results["bloom"][key] == results["exact"][key]
    assert results["exact"]["contaminated_documents"] == 1
    assert (tmp_path / "bloom" / "bloom" / "gsm8k.npy").exists()
    saved = BloomFilter.load(str(tmp_path / "bloom" / "bloom" / "gsm8k"))
    assert saved.contains(ngram_hashes(OTHER_EVAL, 13)).all()


def test_eval_like_training_files_are_refused(corpus: Path, eval_file: str, tmp_path: Path) -> None:
    bundle = tmp_path / "dolmino_math" / "test.json"
    bundle.parent.mkdir()
    bundle.write_text('{"problem": "unrelated"}', encoding="utf-8")
    data = _ingest(corpus, tmp_path / "data", extra=bundle)
    config = DecontaminateConfig(
        input_path=data, eval_sets=(EvalSet("gsm8k", eval_file),), output_path=str(tmp_path / "out")
    )
    with pytest.raises(
        ValueError,
        match=r"(?s)named like evaluation splits.*dolmino_math/test.json.*"
        r"Source.exclude.*allow_eval_like_names=True",
    ):
        decontaminate(config)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    allowed = decontaminate(DecontaminateConfig(**{**config.__dict__, "allow_eval_like_names": True}))
    assert allowed["passed"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("gsm8k/test.json", True),
        ("data/validation-00000-of-00001.parquet", True),
        ("squad/dev.jsonl", True),
        ("Lib/test/test_os.py", True),
        ("mmlu/eval/abstract_algebra.csv", True),
        ("corpus.jsonl:17", False),
        ("contest_results.txt", False),
        ("latest.txt", False),
        ("unittest/case.py", False),
        ("device.py", False),
        ("file:///data/train/00000.jsonl", False),
        ("s3://bucket/heldout/x.txt", True),
    ],
    ids=lambda v: str(v),
)
def test_looks_like_eval_split(path: str, expected: bool) -> None:
    assert looks_like_eval_split(path) is expected


def test_bloom_filter_has_no_false_negatives_and_its_false_positive_rate(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    items = rng.integers(0, 2**63, size=50_000, dtype=np.int64).astype(np.uint64)
    others = rng.integers(0, 2**63, size=200_000, dtype=np.int64).astype(np.uint64)
    bf = BloomFilter(capacity=items.size, fpr=1e-3)
    bf.add(items)
    assert bf.contains(items).all() and int(items[0]) in bf
    assert bf.contains(others).mean() < 2e-3  # sized for 1e-3 (m is rounded up to a power of two)
    bf.save(str(tmp_path / "f"))
    assert np.array_equal(BloomFilter.load(str(tmp_path / "f")).bits, bf.bits)


def test_ngram_hashes_normalise_and_are_stable() -> None:
    a = ngram_hashes("The Quick, brown fox! jumps", 3)
    assert np.array_equal(a, ngram_hashes("the quick brown   fox jumps", 3)) and a.size == 3
    assert ngram_hashes("too short", 3).size == 0
    # stable across processes and runs (no salted hash): a saved Bloom filter stays valid
    assert int(ngram_hashes("one two three", 3)[0]) == int(ngram_hashes("ONE two; three", 3)[0])


def test_config_validation(eval_file: str) -> None:
    with pytest.raises(ValueError, match="register at least one"):
        DecontaminateConfig(input_path="a", eval_sets=(), output_path="o")
    with pytest.raises(ValueError, match="unique"):
        DecontaminateConfig(
            input_path="a", eval_sets=(EvalSet("x", eval_file), EvalSet("x", eval_file)), output_path="o"
        )
    with pytest.raises(ValueError, match="max_contamination"):
        DecontaminateConfig(
            input_path="a", eval_sets=(EvalSet("x", eval_file),), output_path="o", max_contamination=2.0
        )
