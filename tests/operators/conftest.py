"""Small real corpora for the data operator tests: a few stdlib modules (domain python) and pydoc topics
(prose); and the scaling tests' hand-written ladder (`ladder_runs`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from operators.ingest import IngestConfig, Source, ingest
from operators.scaling.fitstep import RungRun
from operators.train_tokenizer import TrainTokenizerConfig, train_tokenizer
from tests.fakes.scaling_ladder import make_ladder_runs

STDLIB_MODULES = ["bisect", "heapq", "colorsys", "keyword", "fnmatch", "shlex", "textwrap", "graphlib",
                  "glob",
                  "stat", "string", "numbers", "abc", "copy", "dataclasses", "functools", "operator", "queue",
                  "random", "statistics", "difflib", "pprint", "reprlib", "enum"]


def write_corpus(root: Path) -> Path:
    """Copies of small stdlib modules as .py files plus pydoc topics as JSONL, under ``root``."""
    code = root / "code"
    code.mkdir(parents=True)
    for name in STDLIB_MODULES:
        mod = __import__(name)
        (code / f"{name}.py").write_text(inspect.getsource(mod), encoding="utf-8")
    from pydoc_data.topics import topics

    with open(root / "topics.jsonl", "w", encoding="utf-8") as f:
        for key in sorted(topics)[:40]:
            f.write(json.dumps({"text": topics[key], "title": key}) + "\n")
    return root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def dataset(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("dataset"))
    ingest(IngestConfig(sources=(Source("python", (str(corpus / "code" / "*.py"),)),
                                 Source("prose", (str(corpus / "topics.jsonl"),), kind="jsonl")),
                        output_path=out, validation_fraction=0.2, shard_bytes=60_000))
    return out


@pytest.fixture(scope="session")
def tokenizer_dir(dataset: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(TrainTokenizerConfig(output_path=out, input_path=dataset, vocab_size=1024))
    return out


@pytest.fixture
def ladder_runs(tmp_path: Path) -> list[RungRun]:
    """A hand-written ladder on a known law (tests/fakes/scaling_ladder.py): 5 rungs x 3 seeds."""
    return make_ladder_runs(tmp_path)
