"""The token cache: write/read round trip (local memmap and fsspec remote), dtypes, resume records, errors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, token_dtype, write_shard

HEADER = CacheHeader(tokenizer={"name": "toy", "sha256": "0" * 64}, vocab_size=300, eos_id=0)


def _docs(rng: np.random.Generator, count: int, domain: str) -> list[tuple[np.ndarray, str, int]]:
    out = []
    for _ in range(count):
        ids = rng.integers(1, 300, size=int(rng.integers(0, 40)))
        out.append((ids, domain, int(ids.size * 3)))
    return out


def _build(path: str, shards: dict[str, list[tuple[np.ndarray, str, int]]]) -> dict:
    writer = CacheWriter(path, HEADER, metadata={"source": "test"})
    for name, docs in shards.items():
        write_shard(path, name, HEADER, docs)
    return writer.write_manifest(expected_shards=list(shards))


@pytest.fixture()
def shards() -> dict[str, list[tuple[np.ndarray, str, int]]]:
    rng = np.random.default_rng(0)
    return {"00000": _docs(rng, 7, "python") + _docs(rng, 3, "prose"), "00001": [],
            "00002": _docs(rng, 5, "prose")}


def _expected_stream(shards: dict[str, list[tuple[np.ndarray, str, int]]]) -> tuple[np.ndarray, list[int]]:
    tokens, starts = [], [0]
    for name in sorted(shards):
        for ids, _, _ in shards[name]:
            tokens.extend([*ids.tolist(), HEADER.eos_id])
            starts.append(len(tokens))
    return np.array(tokens), starts


@pytest.mark.parametrize("where", ["local", "memory"])
def test_round_trip(tmp_path: Path, shards: dict, where: str) -> None:
    path = str(tmp_path / "cache") if where == "local" else f"memory://cache-{uuid.uuid4().hex}"
    manifest = _build(path, shards)
    cache = TokenCache(path)
    want, starts = _expected_stream(shards)
    assert cache.num_tokens == want.size == manifest["totals"]["tokens"]
    assert cache.num_documents == 15
    assert np.array_equal(cache.read(0, cache.num_tokens), want)
    assert np.array_equal(cache.doc_starts, starts)
    # random access across the (empty) middle shard and the shard boundary
    for a, b in [(0, 0), (5, 50), (want.size - 3, want.size), (0, want.size)]:
        assert np.array_equal(cache.read(a, b), want[a:b])
    for i in range(cache.num_documents):
        doc = cache.document(i)
        assert doc[-1] == HEADER.eos_id and np.count_nonzero(doc == HEADER.eos_id) == 1
    cache.verify()
    assert cache.dtype == np.dtype("<u2")


def test_manifest_stats(tmp_path: Path, shards: dict) -> None:
    manifest = _build(str(tmp_path), shards)
    assert manifest["format"] == "moe-token-cache" and manifest["version"] == 1
    assert manifest["dtype"] == "uint16" and manifest["eos_id"] == 0 and manifest["vocab_size"] == 300
    assert manifest["is_finished"] and manifest["finished_shards"] == ["00000", "00001", "00002"]
    py_docs = shards["00000"][:7]
    assert manifest["domains"]["python"] == {"documents": 7, "tokens": sum(d[0].size + 1 for d in py_docs),
                                             "bytes": sum(d[2] for d in py_docs)}
    prose = shards["00000"][7:] + shards["00002"]
    assert manifest["domains"]["prose"]["bytes"] == sum(d[2] for d in prose)
    assert manifest["totals"]["documents"] == 15
    assert manifest["metadata"] == {"source": "test"}
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == manifest


def test_uint32_for_large_vocab(tmp_path: Path) -> None:
    assert token_dtype(65536) == np.dtype("<u2") and token_dtype(65537) == np.dtype("<u4")
    header = CacheHeader(tokenizer={"name": "big"}, vocab_size=100_000, eos_id=99_999)
    CacheWriter(str(tmp_path), header)
    write_shard(str(tmp_path), "a", header, [(np.array([70_000, 5]), "d", 4)])
    CacheWriter(str(tmp_path), header).write_manifest(["a"])
    cache = TokenCache(str(tmp_path))
    assert cache.dtype == np.dtype("<u4")
    assert cache.read(0, 3).tolist() == [70_000, 5, 99_999]
    assert (tmp_path / "shards" / "a.tokens").stat().st_size == 12


def test_unfinished_cache_is_refused_until_complete(tmp_path: Path, shards: dict) -> None:
    writer = CacheWriter(str(tmp_path), HEADER)
    write_shard(str(tmp_path), "00000", HEADER, shards["00000"])
    manifest = writer.write_manifest(expected_shards=list(shards))
    assert not manifest["is_finished"]
    with pytest.raises(ValueError, match="unfinished"):
        TokenCache(str(tmp_path))
    assert TokenCache(str(tmp_path), allow_unfinished=True).num_documents == 10
    assert set(writer.finished()) == {"00000"}


def test_shard_interrupted_mid_write_leaves_no_record(tmp_path: Path, shards: dict) -> None:
    def exploding():
        yield from shards["00000"][:3]
        raise RuntimeError("worker died")

    writer = CacheWriter(str(tmp_path), HEADER)
    with pytest.raises(RuntimeError, match="worker died"):
        write_shard(str(tmp_path), "00000", HEADER, exploding())
    assert writer.finished() == {}
    assert list((tmp_path / "shards").iterdir()) == []  # the temporary file was removed too


def test_header_mismatch_on_resume_is_an_error(tmp_path: Path, shards: dict) -> None:
    _build(str(tmp_path), shards)
    other = CacheHeader(tokenizer={"name": "other"}, vocab_size=300, eos_id=0)
    with pytest.raises(ValueError, match="different tokenizer.*new output path"):
        CacheWriter(str(tmp_path), other).finished()


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CacheHeader(tokenizer={}, vocab_size=10, eos_id=10)
    with pytest.raises(ValueError, match=r"token id outside \[0, 300\)"):
        write_shard(str(tmp_path), "x", HEADER, [(np.array([1, 300]), "d", 1)])
    with pytest.raises(ValueError, match="plain file name"):
        write_shard(str(tmp_path), "a/b", HEADER, [])
    with pytest.raises(FileNotFoundError, match="manifest.json is missing"):
        TokenCache(str(tmp_path / "nothing"))


def test_verify_detects_corruption(tmp_path: Path, shards: dict) -> None:
    _build(str(tmp_path), shards)
    f = tmp_path / "shards" / "00002.tokens"
    data = bytearray(f.read_bytes())
    data[0] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="00002.tokens has sha256"):
        TokenCache(str(tmp_path)).verify()


def test_truncated_tokens_file_is_named(tmp_path: Path, shards: dict) -> None:
    _build(str(tmp_path), shards)
    f = tmp_path / "shards" / "00000.tokens"
    f.write_bytes(f.read_bytes()[:-2])
    with pytest.raises(ValueError, match="00000.tokens has .* bytes.*truncated"):
        TokenCache(str(tmp_path))


def test_a_mistyped_cache_path_names_what_is_there(tmp_path: Path, shards: dict) -> None:
    """A dependency subpath typo (`trian/python` for `train/python`) names the existing caches, not "run the
    tokenize step first" (the step did run)."""
    _build(str(tmp_path / "tokenized" / "train" / "python"), shards)
    _build(str(tmp_path / "tokenized" / "validation" / "python"), shards)
    with pytest.raises(FileNotFoundError, match=r"did you mean 'train'\?") as typo:
        TokenCache(str(tmp_path / "tokenized" / "trian"))
    assert "run the tokenize step" not in str(typo.value)
    with pytest.raises(FileNotFoundError,
                       match=r"holds caches at train/python, validation/python: point at one"):
        TokenCache(str(tmp_path / "tokenized"))
    with pytest.raises(FileNotFoundError, match="run the tokenize step first"):
        TokenCache(str(tmp_path / "nowhere" / "at_all"))
