"""train_tokenizer: a byte-level BPE trained with ``tokenizers`` on a sample of the training documents, or an
existing tokenizer adopted as is (a ``tokenizer.json``, or a SentencePiece ``.model`` converted by
operators/spm_import.py).

Writes ``tokenizer.json`` and ``tokenizer_info.json`` (``{"vocab_size", "eos_token", "eos_id", "sha256",
"kind", "source", "sample": {...}}``) under ``output_path``; ``tokenize`` reads both.

Why byte-level BPE: every string, whatever its script, emoji or whitespace, maps to tokens and decodes back to
exactly the same string (no unknown token, no normalisation), which is what bits-per-byte and a faithful cache
need. The sample is chosen by content hash (a document is in the sample when its id falls below
``sample_bytes / total_bytes`` of the hash space), so it is deterministic and spread over all domains instead
of being the first shards.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from moe_trainer.jsonio import write_bytes_atomic, write_json_atomic
from operators.documents import iter_documents, read_manifest
from operators.spm_import import tokenizer_from_spm

TOKENIZER_FILE, INFO_FILE = "tokenizer.json", "tokenizer_info.json"


@dataclass(frozen=True)
class TrainTokenizerConfig:
    output_path: str
    """Where tokenizer.json and tokenizer_info.json are written."""
    input_path: str | None = None
    """A document dataset (ingest/decontaminate output) whose train split is sampled; unused with
    ``existing``."""
    vocab_size: int = 8192
    """Vocabulary size of the trained BPE, special tokens included (<= 65536 keeps the cache at uint16)."""
    sample_bytes: int = 50_000_000
    """About this many UTF-8 bytes of training text are used to learn the merges."""
    min_frequency: int = 2
    """A pair must occur this often in the sample to be merged."""
    existing: str | None = None
    """Adopt this tokenizer instead of training: a tokenizer.json, or a SentencePiece .model file."""
    eos_token: str = "<|endoftext|>"
    """The end-of-document token (added as a special token if the tokenizer lacks it)."""

    def __post_init__(self) -> None:
        if self.existing is None and self.input_path is None:
            raise ValueError("TrainTokenizerConfig needs input_path (documents to train on) or existing "
                             "(a tokenizer.json or SentencePiece .model to adopt)")
        if self.existing is None and not 257 <= self.vocab_size <= 1 << 20:
            raise ValueError(f"vocab_size {self.vocab_size} must be in [257, 2**20]: a byte-level BPE needs "
                             "the "
                             "256 byte symbols plus the EOS token")
        if self.sample_bytes < 1:
            raise ValueError(f"sample_bytes must be >= 1, got {self.sample_bytes}")


def byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE: GPT-2-style pre-tokenisation, no normaliser, exact byte round trip."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sample(config: TrainTokenizerConfig, input_path: str) -> tuple[Iterator[str], dict[str, Any]]:
    total = read_manifest(input_path)["splits"]["train"]["bytes"]
    fraction = min(1.0, config.sample_bytes / max(total, 1))
    stats = {"fraction": fraction, "documents": 0, "bytes": 0}

    def texts() -> Iterator[str]:
        for doc in iter_documents(input_path, "train"):
            if int(doc["id"][:15], 16) < fraction * 16**15:
                stats["documents"] += 1
                stats["bytes"] += len(doc["text"].encode("utf-8"))
                yield doc["text"]

    return texts(), stats


def _adopt(path: str) -> tuple[Tokenizer, str]:
    with fsspec.open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json") or data[:1] == b"{":
        try:
            return Tokenizer.from_str(data.decode("utf-8")), "tokenizer.json"
        except Exception as e:
            raise ValueError(f"train_tokenizer: {path} is not a valid tokenizer.json ({e})") from e
    try:
        return tokenizer_from_spm(data), "sentencepiece"
    except ValueError as e:
        raise ValueError(f"train_tokenizer: {path} is neither a tokenizer.json nor a SentencePiece .model "
                         f"({e})") from e


def train_tokenizer(config: TrainTokenizerConfig) -> dict[str, Any]:
    """Train or adopt the tokenizer, save it, and return tokenizer_info."""
    sample: dict[str, Any] | None = None
    if config.existing is not None:
        tok, kind = _adopt(config.existing)
        source = config.existing
    else:
        assert config.input_path is not None  # guaranteed by __post_init__
        tok, kind, source = byte_level_bpe(), "byte-level-bpe", config.input_path
        texts, sample = _sample(config, config.input_path)
        trainer = trainers.BpeTrainer(vocab_size=config.vocab_size, min_frequency=config.min_frequency,
                                      special_tokens=[config.eos_token], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        if sample["documents"] == 0:
            raise ValueError(f"train_tokenizer: the sample of {config.input_path} is empty; raise "
                             "sample_bytes")
    if tok.token_to_id(config.eos_token) is None:
        tok.add_special_tokens([config.eos_token])
    blob = tok.to_str().encode("utf-8")
    info = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "eos_token": config.eos_token,
            "eos_id": tok.token_to_id(config.eos_token), "sha256": hashlib.sha256(blob).hexdigest(),
            "kind": kind, "source": source, "sample": sample}
    write_bytes_atomic(f"{config.output_path.rstrip('/')}/{TOKENIZER_FILE}", blob)
    write_json_atomic(f"{config.output_path.rstrip('/')}/{INFO_FILE}", info)
    print(f"[train_tokenizer] {kind}: vocab {info['vocab_size']}, eos {config.eos_token!r} = "
          f"{info['eos_id']}, "
          f"saved to {config.output_path}", file=sys.stderr)
    return info


def load_tokenizer(path: str) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer, info) from a train_tokenizer output directory, set to encode special-token text
    literally."""
    root = path.rstrip("/")
    try:
        with fsspec.open(f"{root}/{TOKENIZER_FILE}", "rb") as f:
            blob = f.read()
        with fsspec.open(f"{root}/{INFO_FILE}", "rb") as f:
            info = json.load(f)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no tokenizer at {path}: expected {TOKENIZER_FILE} and {INFO_FILE} written "
                                "by "
                                "the train_tokenizer step") from e
    tok = Tokenizer.from_str(blob.decode("utf-8"))
    # text that happens to spell a special token ("<|endoftext|>" in a document about tokenizers) must encode
    # as ordinary text: only the cache writer may place EOS, or documents would split and not round-trip
    tok.encode_special_tokens = True
    return tok, info
