"""The token cache on a real S3 API (moto's server on loopback): writer, resume records and range reads."""

from __future__ import annotations

import numpy as np
import pytest

from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, write_shard
from moe_trainer.data.loader import TrainLoader

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3_endpoint(moto_endpoint: str) -> str:
    """The session's moto S3 server (root conftest.py starts it and checks that it answers)."""
    return moto_endpoint


def test_cache_round_trip_on_s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_endpoint,
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, key="test", secret="test")
    fs.mkdir("tokens")
    s3fs.S3FileSystem.clear_instance_cache()
    header = CacheHeader(tokenizer={"name": "toy"}, vocab_size=500, eos_id=0)
    rng = np.random.default_rng(0)
    shards = {f"{i:05d}": [(rng.integers(1, 500, size=int(rng.integers(1, 50))), "d", 7) for _ in range(20)]
              for i in range(2)}
    path = "s3://tokens/cache"
    writer = CacheWriter(path, header)
    for name, docs in shards.items():
        write_shard(path, name, header, docs)
    assert set(writer.finished()) == set(shards)
    writer.write_manifest(list(shards))
    cache = TokenCache(path)
    want = np.concatenate([np.append(ids, 0) for name in sorted(shards) for ids, _, _ in shards[name]])
    assert cache.num_tokens == want.size and cache.num_documents == 40
    assert np.array_equal(cache.read(0, cache.num_tokens), want)
    assert np.array_equal(cache.read(want.size // 2 - 5, want.size // 2 + 5),
                          want[want.size // 2 - 5: want.size // 2 + 5])
    cache.verify()
    batch = TrainLoader(cache, batch_size=2, seq_len=16, seed=1).batch(3)
    assert batch["inputs"].shape == (2, 16)
