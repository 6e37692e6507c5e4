"""tokenize: the cache equals a straightforward re-tokenisation, workers agree, crashes resume per shard."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import operators.tokenize as tokenize_mod
from moe_trainer.data.cache import TokenCache
from moe_trainer.data.loader import TrainLoader
from operators.documents import iter_documents, read_manifest
from operators.tokenize import TokenizeConfig, tokenize
from operators.train_tokenizer import load_tokenizer


def _reference(dataset: str, tokenizer_dir: str, split: str, domain: str | None = None) -> list[int]:
    """The obvious way: encode each document alone, append EOS, concatenate in dataset order."""
    tok, info = load_tokenizer(tokenizer_dir)
    out: list[int] = []
    for doc in iter_documents(dataset, split):
        if domain is None or doc["domain"] == domain:
            out += tok.encode(doc["text"], add_special_tokens=False).ids + [info["eos_id"]]
    return out


@pytest.fixture(scope="module")
def tokenized(dataset: str, tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("tokenized"))
    tokenize(TokenizeConfig(input_path=dataset, tokenizer_path=tokenizer_dir, output_path=out, num_workers=2,
                            backend="processes"))
    return out


def _digests(root: str) -> dict[str, Any]:
    caches = {}
    for manifest in sorted(Path(root).rglob("manifest.json")):
        m = json.loads(manifest.read_text())
        caches[str(manifest.parent.relative_to(root))] = [(s["name"],
                                                           s["tokens_sha256"]) for s in m["shards"]]
    return caches


def test_cache_equals_straightforward_tokenization(dataset: str, tokenizer_dir: str, tokenized: str) -> None:
    cache = TokenCache(f"{tokenized}/train")
    want = _reference(dataset, tokenizer_dir, "train")
    assert cache.read(0, cache.num_tokens).tolist() == want
    cache.verify()
    manifest = read_manifest(dataset)
    train = manifest["splits"]["train"]
    assert cache.num_documents == train["documents"]
    assert cache.num_bytes == train["bytes"]
    for dom, stats in cache.domains.items():
        assert stats.documents == train["domains"][dom]["documents"]
        assert stats.bytes == train["domains"][dom]["bytes"]
        assert stats.tokens == len(_reference(dataset, tokenizer_dir, "train", dom))
    assert cache.dtype == np.dtype("<u2") and cache.eos_id == load_tokenizer(tokenizer_dir)[1]["eos_id"]


def test_per_domain_validation_caches(dataset: str, tokenizer_dir: str, tokenized: str) -> None:
    summary = json.loads(Path(tokenized, "tokenize.json").read_text())
    val_domains = read_manifest(dataset)["splits"]["validation"]["domains"]
    assert set(summary["validation"]) == set(val_domains)
    for dom, rel in summary["validation"].items():
        cache = TokenCache(f"{tokenized}/{rel}")
        assert cache.read(0, cache.num_tokens).tolist() == _reference(dataset, tokenizer_dir, "validation",
                                                                      dom)
        assert set(cache.domains) == {dom} and cache.num_bytes == val_domains[dom]["bytes"]


def test_train_by_domain_writes_one_cache_per_mixture_source(dataset: str, tokenizer_dir: str, tokenized: str,
                                                             tmp_path: Path) -> None:
    summary = tokenize(
        TokenizeConfig(
            input_path=dataset,
            tokenizer_path=tokenizer_dir,
            output_path=str(tmp_path),
            num_workers=1,
            backend="processes",
            train_by_domain=True,
        )
    )
    train_domains = read_manifest(dataset)["splits"]["train"]["domains"]
    assert summary["train"] is None and set(summary["train_domains"]) == set(train_domains) == {
        "python",
        "prose",
    }
    assert summary["validation"] == json.loads(Path(tokenized, "tokenize.json").read_text())["validation"]
    total = 0
    for dom, rel in summary["train_domains"].items():
        cache = TokenCache(f"{tmp_path}/{rel}")
        assert rel == f"train/{dom}" and set(cache.domains) == {dom}
        assert cache.read(0, cache.num_tokens).tolist() == _reference(dataset, tokenizer_dir, "train", dom)
        assert cache.num_bytes == train_domains[dom]["bytes"]
        total += cache.num_tokens
    assert total == TokenCache(f"{tokenized}/train").num_tokens
    assert not Path(tmp_path, "train", "manifest.json").exists()


def test_one_worker_and_two_workers_write_identical_caches(
    dataset: str, tokenizer_dir: str, tokenized: str, tmp_path: Path
) -> None:
    summary = tokenize(
        TokenizeConfig(
            input_path=dataset,
            tokenizer_path=tokenizer_dir,
            output_path=str(tmp_path),
            num_workers=1,
            backend="processes",
        )
    )
    assert _digests(str(tmp_path)) == _digests(tokenized)
    all_tokens = sum(TokenCache(str(p.parent)).num_tokens for p in tmp_path.rglob("manifest.json"))
    work = summary["work"]
    splits = read_manifest(dataset)["splits"]
    assert work["tokens"] == all_tokens and work["shards"] == sum(len(v["shards"]) for v in splits.values())
    assert work["worker_cpu_seconds"] > 0 and work["tokens_per_worker_cpu_s"] > 0


def test_fork_server_pool_when_other_threads_run(
    dataset: str, tokenizer_dir: str, tokenized: str, tmp_path: Path
) -> None:
    # inside an executor worker other threads (lease heartbeats) exist: fork is unsafe, the pool must start
    # its
    # workers from a fork server instead
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert tokenize_mod._pool_context().get_start_method() == "forkserver"
        tokenize(
            TokenizeConfig(
                input_path=dataset,
                tokenizer_path=tokenizer_dir,
                output_path=str(tmp_path),
                num_workers=2,
                backend="processes",
            )
        )
    finally:
        stop.set()
        thread.join()
    assert _digests(str(tmp_path)) == _digests(tokenized)


def test_resume_after_crash_mid_shard(
    dataset: str, tokenizer_dir: str, tokenized: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_shard = tokenize_mod.write_shard
    entries = read_manifest(dataset)["splits"]["train"]["shards"]
    shards = [s["name"] for s in entries]
    crash_at = next(s["name"] for s in entries[1:] if s["documents"] >= 2)  # so the crash is mid-shard

    def crashing(cache_path: str, name: str, header: Any, documents: Any) -> Any:
        if name == crash_at and cache_path.endswith("/train"):

            def die_midway() -> Any:
                for i, doc in enumerate(documents):
                    if i == 1:
                        raise RuntimeError("simulated worker crash")
                    yield doc

            return real_write_shard(cache_path, name, header, die_midway())
        return real_write_shard(cache_path, name, header, documents)

    config = TokenizeConfig(
        input_path=dataset,
        tokenizer_path=tokenizer_dir,
        output_path=str(tmp_path),
        num_workers=1,
        backend="processes",
    )  # in-process, so the patched writer is used
    monkeypatch.setattr(tokenize_mod, "write_shard", crashing)
    with pytest.raises(RuntimeError, match="simulated worker crash"):
        tokenize(config)
    train_shards = tmp_path / "train" / "shards"
    assert (train_shards / f"{shards[0]}.json").exists()
    assert not (train_shards / f"{crash_at}.json").exists()
    first_record = (train_shards / f"{shards[0]}.json").stat().st_mtime_ns
    # a hard kill would also leave a half-written temporary behind
    (train_shards / f"{crash_at}.tokens.tmp-deadbeef").write_bytes(b"\x01\x02")

    rewritten: list[str] = []

    def spy(cache_path: str, name: str, header: Any, documents: Any) -> Any:
        rewritten.append(f"{cache_path.rsplit('/', 1)[-1]}/{name}")
        return real_write_shard(cache_path, name, header, documents)

    monkeypatch.setattr(tokenize_mod, "write_shard", spy)
    summary = tokenize(config)
    assert f"train/{shards[0]}" not in rewritten and f"train/{crash_at}" in rewritten
    assert summary["resumed_shards"] >= 1
    assert (train_shards / f"{shards[0]}.json").stat().st_mtime_ns == first_record
    assert not list(train_shards.glob("*.tmp-*"))
    assert _digests(str(tmp_path)) == _digests(tokenized)
    rewritten.clear()
    tokenize(config)  # everything finished: nothing is tokenized again
    assert rewritten == []


def test_loader_reads_the_operator_cache(tokenized: str) -> None:
    cache = TokenCache(f"{tokenized}/train")
    batch = TrainLoader(cache, batch_size=4, seq_len=64, seed=0).batch(0)
    assert batch["inputs"].shape == (4, 64) and int(batch["inputs"].max()) < cache.vocab_size


def test_bad_inputs(dataset: str, tokenizer_dir: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        tokenize(
            TokenizeConfig(
                input_path=dataset, tokenizer_path=str(tmp_path / "nope"), output_path=str(tmp_path / "o")
            )
        )
    with pytest.raises(FileNotFoundError, match="no document dataset"):
        tokenize(
            TokenizeConfig(
                input_path=str(tmp_path), tokenizer_path=tokenizer_dir, output_path=str(tmp_path / "o")
            )
        )
    with pytest.raises(ValueError, match="backend 'spark'"):
        TokenizeConfig(input_path="a", tokenizer_path="b", output_path="c", backend="spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_workers"):
        TokenizeConfig(input_path="a", tokenizer_path="b", output_path="c", num_workers=0)


@pytest.mark.ray
def test_tokenize_on_ray_matches_process_pool(
    dataset: str, tokenizer_dir: str, tokenized: str, tmp_path: Path, ray_embedded: Any
) -> None:
    assert ray_embedded.is_initialized()  # tokenize picks Ray tasks whenever Ray is up
    tokenize(
        TokenizeConfig(
            input_path=dataset, tokenizer_path=tokenizer_dir, output_path=str(tmp_path), backend="ray"
        )
    )
    assert _digests(str(tmp_path)) == _digests(tokenized)
