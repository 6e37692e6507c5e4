"""Loaders: packed windows equal the straightforward stream, document segments, exact resume, epochs,
process splitting, and evaluation that targets every token exactly once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, write_shard
from moe_trainer.data.loader import EvalLoader, Prefetcher, TrainLoader

EOS = 0
HEADER = CacheHeader(tokenizer={"name": "toy"}, vocab_size=1000, eos_id=EOS)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> TokenCache:
    path = str(tmp_path_factory.mktemp("cache"))
    rng = np.random.default_rng(1)
    writer = CacheWriter(path, HEADER)
    for shard in range(3):
        docs = [(rng.integers(1, 1000, size=int(rng.integers(1, 60))), "d", 10) for _ in range(40)]
        write_shard(path, f"{shard:05d}", HEADER, docs)
    writer.write_manifest([f"{s:05d}" for s in range(3)])
    return TokenCache(path)


def _stream(cache: TokenCache) -> np.ndarray:
    return np.concatenate([[EOS], cache.read(0, cache.num_tokens)]).astype(np.int32)


def _doc_of_stream_position(cache: TokenCache) -> np.ndarray:
    """Brute force: the EOS that ends document k (and every stream position after it) starts document k+1."""
    stream = _stream(cache)
    doc = np.zeros(stream.size, dtype=np.int64)
    current = 0
    for q in range(1, stream.size):
        if stream[q] == EOS:
            current += 1
        doc[q] = current
    return doc


def test_training_windows_match_the_stream(cache: TokenCache) -> None:
    s = 32
    loader = TrainLoader(cache, batch_size=4, seq_len=s, seed=3)
    stream, doc = _stream(cache), _doc_of_stream_position(cache)
    assert loader.num_sequences == cache.num_tokens // s
    for step in (0, 1, 17):
        batch = loader.batch(step)
        assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
            "inputs": (np.int32, (4, s)), "targets": (np.int32, (4, s)),
            "segment_ids": (np.int32, (4, s)), "loss_mask": (np.float32, (4, s))}
        for row, i in enumerate(loader.sequence_indices(step)):
            q = np.arange(i * s, i * s + s)
            assert np.array_equal(batch["inputs"][row], stream[q])
            assert np.array_equal(batch["targets"][row], stream[q + 1])
            assert np.array_equal(batch["segment_ids"][row], doc[q] - doc[q[0]])
        assert np.all(batch["loss_mask"] == 1.0)


def test_segments_start_at_each_eos_input(cache: TokenCache) -> None:
    batch = TrainLoader(cache, batch_size=8, seq_len=64, seed=0).batch(2)
    seg, inp = batch["segment_ids"], batch["inputs"]
    starts_new = np.diff(seg, axis=1) == 1
    assert np.array_equal(starts_new, inp[:, 1:] == EOS)
    assert np.all(np.diff(seg, axis=1) >= 0) and np.all(seg[:, 0] == 0)
    # at least one boundary inside the windows, or the test would prove nothing
    assert starts_new.any()


def test_resume_is_exact(cache: TokenCache) -> None:
    first = TrainLoader(cache, batch_size=4, seq_len=16, seed=11)
    run = [first.batch(k) for k in range(12)]
    restarted = TrainLoader(TokenCache(cache.path), batch_size=4, seq_len=16, seed=11)
    with restarted.iterate(start_step=7, num_steps=5, prefetch=3) as it:
        resumed = list(it)
    assert len(resumed) == 5
    for a, b in zip(run[7:], resumed, strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key])
    other_seed = TrainLoader(cache, batch_size=4, seq_len=16, seed=12).batch(7)
    assert not np.array_equal(other_seed["inputs"], run[7]["inputs"])


def test_every_sequence_once_per_epoch_and_new_order_each_epoch(cache: TokenCache) -> None:
    loader = TrainLoader(cache, batch_size=5, seq_len=10, seed=4)
    n = loader.num_sequences
    seen = np.concatenate([loader.sequence_indices(k) for k in range(-(-2 * n // 5))])[: 2 * n]
    epoch0, epoch1 = seen[:n], seen[n:]
    assert np.array_equal(np.sort(epoch0), np.arange(n)) and np.array_equal(np.sort(epoch1), np.arange(n))
    assert not np.array_equal(epoch0, epoch1)


def test_process_split_reassembles_the_global_batch(cache: TokenCache) -> None:
    whole = TrainLoader(cache, batch_size=6, seq_len=20, seed=2).batch(3)
    parts = [TrainLoader(cache, batch_size=6, seq_len=20, seed=2, process_index=p, process_count=3).batch(3)
             for p in range(3)]
    for key in whole:
        assert np.array_equal(whole[key], np.concatenate([p[key] for p in parts]))


def test_eval_targets_every_token_exactly_once(cache: TokenCache) -> None:
    loader = EvalLoader(cache, batch_size=3, seq_len=50)
    targets, inputs, doc = [], [], _doc_of_stream_position(cache)
    stream = _stream(cache)
    for k, batch in enumerate(loader):
        mask = batch["loss_mask"] > 0
        targets.append(batch["targets"][mask])
        inputs.append(batch["inputs"][mask])
        assert np.all(batch["segment_ids"][~mask] == -1)
        for row in range(3):
            w = k * 3 + row
            n = int(mask[row].sum())
            q = np.arange(w * 50, w * 50 + n)
            assert np.array_equal(batch["segment_ids"][row, :n], doc[q] - doc[q[0]] if n else [])
    assert k == loader.num_batches - 1
    assert np.array_equal(np.concatenate(targets), cache.read(0, cache.num_tokens))
    assert np.array_equal(np.concatenate(inputs), stream[:-1])
    assert loader.num_targets == cache.num_tokens and loader.num_bytes == 120 * 10


def test_bad_loader_arguments(cache: TokenCache) -> None:
    with pytest.raises(ValueError, match="fewer than one sequence"):
        TrainLoader(cache, batch_size=1, seq_len=cache.num_tokens + 1, seed=0)
    with pytest.raises(ValueError, match="split evenly"):
        TrainLoader(cache, batch_size=5, seq_len=8, seed=0, process_count=2)
    with pytest.raises(IndexError, match="evaluation batch 1000000"):
        EvalLoader(cache, 2, 8).batch(10**6)


def test_prefetcher_reraises_worker_errors() -> None:
    def fn(k: int) -> dict:
        if k == 2:
            raise KeyError("shard vanished")
        return {"k": np.array(k)}

    it = Prefetcher(fn, 0, None, depth=2)
    assert [int(next(it)["k"]) for _ in range(2)] == [0, 1]
    with pytest.raises(KeyError, match="shard vanished"):
        next(it)


def test_loader_reads_remote_cache_through_fsspec(tmp_path: Path, cache: TokenCache) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.put(cache.path, "/remote-cache", recursive=True)
    remote = TokenCache("memory:///remote-cache")
    a = TrainLoader(cache, batch_size=2, seq_len=24, seed=5).batch(4)
    b = TrainLoader(remote, batch_size=2, seq_len=24, seed=5).batch(4)
    for key in a:
        assert np.array_equal(a[key], b[key])


def test_prefetcher_thread_stops_when_closed_or_dropped() -> None:
    import gc
    import time

    it = Prefetcher(lambda k: {"k": np.array(k)}, 0, None, depth=2)
    thread = it._thread
    assert int(next(it)["k"]) == 0
    it.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
    dropped = Prefetcher(lambda k: {"k": np.array(k)}, 0, None, depth=2)
    thread = dropped._thread
    time.sleep(0.05)
    del dropped
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
