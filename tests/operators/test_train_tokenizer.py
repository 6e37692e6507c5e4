"""train_tokenizer: byte-level BPE that round-trips any text exactly; adopting tokenizer.json and
SentencePiece."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from operators.train_tokenizer import TrainTokenizerConfig, load_tokenizer, train_tokenizer

HARD_TEXTS = [
    "", " ", "  two leading spaces", "trailing spaces   ", "\t\ttabs\tand\r\nCRLF\n\n\nnewlines\r",
    "héllo wörld — naïve café", "日本語のテキストと中文", "emoji 😀👩‍👩‍👧‍👦🏳️‍🌈 flags 🇫🇷",
    "zero\u200bwidth\ufeffBOM and combining e\u0301", "control \x00\x01\x1f chars",
    "<|endoftext|> is text here",
    "def f(x):\n    return x ** 2  # comment\n", "Ünïcödé\u2028line\u2029separators", "a" * 500,
]


def test_trained_tokenizer_round_trips_exactly(tokenizer_dir: str) -> None:
    tok, info = load_tokenizer(tokenizer_dir)
    assert info["vocab_size"] == tok.get_vocab_size(with_added_tokens=True) == 1024
    assert info["kind"] == "byte-level-bpe" and info["eos_token"] == "<|endoftext|>"
    assert tok.token_to_id("<|endoftext|>") == info["eos_id"]
    for text in HARD_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert info["eos_id"] not in ids, text  # special-token text never becomes an EOS
        assert tok.decode(ids, skip_special_tokens=False) == text
    # a trained vocabulary actually compresses real text (merges were learned)
    code = "def function(self, value):\n    return self.value\n"
    assert len(tok.encode(code).ids) < len(code.encode()) / 2


def test_training_is_deterministic(dataset: str, tokenizer_dir: str, tmp_path: Path) -> None:
    again = train_tokenizer(TrainTokenizerConfig(output_path=str(tmp_path), input_path=dataset,
                                                 vocab_size=1024))
    assert again["sha256"] == load_tokenizer(tokenizer_dir)[1]["sha256"]
    assert again["sample"]["documents"] > 0


def test_sample_is_a_fraction_of_documents(dataset: str, tmp_path: Path) -> None:
    info = train_tokenizer(TrainTokenizerConfig(output_path=str(tmp_path), input_path=dataset, vocab_size=512,
                                                sample_bytes=100_000))
    assert info["sample"]["fraction"] < 1.0
    assert 0 < info["sample"]["bytes"] < 250_000


def test_adopt_existing_tokenizer_json(tmp_path: Path) -> None:
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "given.json"))
    info = train_tokenizer(TrainTokenizerConfig(output_path=str(tmp_path / "out"),
                                                existing=str(tmp_path / "given.json"), eos_token="</s>"))
    loaded, _ = load_tokenizer(str(tmp_path / "out"))
    assert info["kind"] == "tokenizer.json" and info["eos_id"] == 3 and info["vocab_size"] == 4
    assert loaded.encode("a b a", add_special_tokens=False).ids == [0, 1, 0]


def test_adopt_sentencepiece_model(tmp_path: Path) -> None:
    spm = pytest.importorskip("sentencepiece")
    from pydoc_data.topics import topics

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(list(topics.values())[:30]), encoding="utf-8")
    samples = [t[:400] for t in list(topics.values())[30:60]] + ["héllo wörld 😀", "plain words only"]
    for model_type in ("bpe", "unigram"):
        prefix = tmp_path / model_type
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), vocab_size=600,
                                       model_type=model_type, byte_fallback=True, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
        out = tmp_path / f"out-{model_type}"
        info = train_tokenizer(TrainTokenizerConfig(output_path=str(out), existing=f"{prefix}.model",
                                                    eos_token="</s>"))
        tok, _ = load_tokenizer(str(out))
        assert info["kind"] == "sentencepiece" and info["eos_id"] == sp.piece_to_id("</s>")
        same = sum(tok.encode(s, add_special_tokens=False).ids == sp.encode(s) for s in samples)
        if model_type == "bpe":
            assert same == len(samples)
        else:
            # Unigram: equal-score segmentations (runs like "****") may break ties differently; see
            # spm_import.py
            assert same >= len(samples) - 3
        for s in samples:  # either way the ids decode to what sentencepiece decodes
            assert tok.decode(sp.encode(s)) == sp.decode(sp.encode(s))


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs input_path"):
        TrainTokenizerConfig(output_path="x")
    with pytest.raises(ValueError, match="vocab_size 100"):
        TrainTokenizerConfig(output_path="x", input_path="y", vocab_size=100)
    (tmp_path / "junk.model").write_bytes(b"\xff\xff\xff\xff\xff")
    with pytest.raises(ValueError, match="neither a tokenizer.json nor a SentencePiece"):
        train_tokenizer(TrainTokenizerConfig(output_path=str(tmp_path / "o"),
                                             existing=str(tmp_path / "junk.model")))
    (tmp_path / "broken.json").write_text(json.dumps({"model": "nope"}))
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        train_tokenizer(TrainTokenizerConfig(output_path=str(tmp_path / "o"),
                                             existing=str(tmp_path / "broken.json")))
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        load_tokenizer(str(tmp_path / "missing"))
