"""Mixtures: weights honoured (exactly per block, within sampling error inside one), stages switch at their
step, each source keeps its own Feistel order and epochs, a one-source mixture is the TrainLoader, the process
split, tokens seen per source, and the configuration errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moe_trainer.data.cache import CacheHeader, CacheWriter, TokenCache, write_shard
from moe_trainer.data.loader import TrainLoader
from moe_trainer.data.mixture import MixtureConfig, MixtureLoader, MixtureSampler, MixtureStage, block_counts
from moe_trainer.data.permutation import FeistelPermutation

EOS = 0
HEADER = CacheHeader(tokenizer={"name": "toy"}, vocab_size=1000, eos_id=EOS)
SEQ = 16


def _cache(path: str, seed: int, docs: int, header: CacheHeader = HEADER) -> TokenCache:
    rng = np.random.default_rng(seed)
    writer = CacheWriter(path, header)
    write_shard(path, "00000", header, [(rng.integers(1, 1000, size=int(rng.integers(1, 50))), "d", 10)
                                        for _ in range(docs)])
    writer.write_manifest(["00000"])
    return TokenCache(path)


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TokenCache]:
    root = tmp_path_factory.mktemp("mix")
    return {"a": _cache(str(root / "a"), 1, 120), "b": _cache(str(root / "b"), 2, 40),
            "c": _cache(str(root / "c"), 3, 15)}


def _config(caches: dict[str, TokenCache], weights: dict[str, float], stages: tuple[MixtureStage, ...] = (),
            block_size: int = 64) -> MixtureConfig:
    return MixtureConfig(sources={n: c.path for n, c in caches.items()}, weights=weights, stages=stages,
                         block_size=block_size)


def test_block_counts_are_the_largest_remainder_rounding() -> None:
    assert block_counts({"a": 0.6, "b": 0.3, "c": 0.1}, ["a", "b", "c"], 64).tolist() == [39, 19, 6]
    assert block_counts({"a": 1, "b": 1, "c": 1}, ["a", "b", "c"], 10).tolist() == [4, 3, 3]  # tie: first
    assert block_counts({"a": 2.0}, ["a", "b"], 5).tolist() == [5, 0]


def test_a_one_source_mixture_is_the_train_loader(caches: dict[str, TokenCache]) -> None:
    mix = MixtureLoader(
        {"a": caches["a"]},
        MixtureConfig(sources={"a": caches["a"].path}, weights={"a": 1.0}),
        batch_size=4,
        seq_len=SEQ,
        seed=5,
    )
    plain = TrainLoader(caches["a"], batch_size=4, seq_len=SEQ, seed=5)
    for step in (0, 3, 40, 97):  # 97 * 4 rows is past the first epoch
        got, want = mix.batch(step), plain.batch(step)
        assert all(np.array_equal(got[k], want[k]) for k in want), step


def test_rows_of_each_block_follow_the_weights_exactly(caches: dict[str, TokenCache]) -> None:
    cfg = _config(caches, {"a": 0.6, "b": 0.3, "c": 0.1})
    loader = MixtureLoader(caches, cfg, batch_size=8, seq_len=SEQ, seed=0)
    src = np.concatenate([loader.sequence_indices(step)[0] for step in range(64)])  # 512 rows = 8 blocks
    for block in range(8):
        assert np.bincount(src[block * 64 : (block + 1) * 64], minlength=3).tolist() == [39, 19, 6]
    # tokens_seen is the brute-force count at every step
    for step in range(65):
        counts = np.bincount(src[: step * 8], minlength=3) * SEQ
        assert list(loader.tokens_seen(step).values()) == counts.tolist(), step
    # exact for a fixed seed: the scheme is pinned (a change of the rule must be deliberate)
    assert loader.tokens_seen(13) == {"a": 1008, "b": 496, "c": 160}
    assert loader.sequence_indices(13)[0].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


def test_token_counts_stay_within_sampling_error_over_a_long_run(caches: dict[str, TokenCache]) -> None:
    """Over J rows the count of source s is c_s per whole block plus a hypergeometric draw in the last partial
    block: |count - w J| <= (whole blocks) * max rounding error + 4 sigma of that draw."""
    weights = {"a": 0.55, "b": 0.35, "c": 0.10}
    k, batch = 1000, 24
    sampler = MixtureSampler(list(weights), (MixtureStage(0, weights),), batch, k, seed=11)
    w = np.array(list(weights.values()))
    rounding = np.abs(block_counts(weights, list(weights), k) - w * k)
    for step in (7, 100, 333, 1250, 4001):  # up to ~96,000 rows
        rows = step * batch
        full, m = divmod(rows, k)
        sigma = np.sqrt(m * w * (1 - w) * (k - m) / (k - 1))
        deviation = np.abs(sampler.rows_seen(step) - w * rows)
        assert np.all(deviation <= full * rounding + 4 * sigma + 1e-9), (step, deviation)
    # and the realised share over the long run is the weight to within 1/K
    long = sampler.rows_seen(4000) / (4000 * batch)
    assert np.allclose(long, w, atol=1 / k)


def test_each_source_keeps_its_own_feistel_order_and_epochs(caches: dict[str, TokenCache]) -> None:
    cfg = _config(caches, {"a": 0.5, "b": 0.3, "c": 0.2})
    loader = MixtureLoader(caches, cfg, batch_size=8, seq_len=SEQ, seed=4)
    steps = 200
    src, seq = map(np.concatenate, zip(*[loader.sequence_indices(t) for t in range(steps)], strict=True))
    for s, name in enumerate(loader.names):
        n = loader.num_sequences[s]
        mine = seq[src == s]
        epochs, within = np.divmod(np.arange(mine.size), n)
        want = np.array(
            [FeistelPermutation(n, 4, int(e))(np.array([i]))[0] for e, i in zip(epochs, within, strict=True)]
        )
        assert np.array_equal(mine, want), name
        assert mine.size > n  # every source passed an epoch boundary in this run
        for e in range(mine.size // n):  # a full epoch reads every sequence once
            assert sorted(mine[e * n : (e + 1) * n].tolist()) == list(range(n))
        assert loader.epochs(steps)[name] == pytest.approx(mine.size / n)


def test_stages_change_the_weights_at_their_step_and_sources_resume_their_streams(
    caches: dict[str, TokenCache],
) -> None:
    stages = (MixtureStage(10, {"b": 1.0}), MixtureStage(17, {"a": 1.0, "b": 1.0}))
    cfg = _config(caches, {"a": 1.0}, stages)
    loader = MixtureLoader(caches, cfg, batch_size=6, seq_len=SEQ, seed=2)
    sampler = loader.sampler
    per_step = [sampler.rows(t * 6 + np.arange(6, dtype=np.int64)) for t in range(40)]
    assert all((src == 0).all() for src, _ in per_step[:10])
    assert all((src == 1).all() for src, _ in per_step[10:17])
    assert set(np.concatenate([src for src, _ in per_step[17:]]).tolist()) == {0, 1}
    # positions in each source's own stream continue across stages: 0, 1, 2, ... with no gap or repeat
    src = np.concatenate([s for s, _ in per_step])
    pos = np.concatenate([p for _, p in per_step])
    for s in (0, 1):
        assert pos[src == s].tolist() == list(range(int((src == s).sum())))
    assert loader.tokens_seen(10) == {"a": 60 * SEQ, "b": 0, "c": 0}
    assert loader.tokens_seen(17) == {"a": 60 * SEQ, "b": 42 * SEQ, "c": 0}


def test_a_process_gets_its_rows_of_the_global_batch(caches: dict[str, TokenCache]) -> None:
    cfg = _config(caches, {"a": 0.5, "b": 0.5}, (MixtureStage(3, {"c": 1.0, "a": 1.0}),))
    whole = MixtureLoader(caches, cfg, batch_size=8, seq_len=SEQ, seed=9)
    parts = [
        MixtureLoader(caches, cfg, batch_size=8, seq_len=SEQ, seed=9, process_index=i, process_count=2)
        for i in range(2)
    ]
    for step in (0, 2, 3, 30):
        want = whole.batch(step)
        got = [p.batch(step) for p in parts]
        for key in want:
            assert np.array_equal(np.concatenate([g[key] for g in got]), want[key]), (step, key)


def test_rows_are_the_windows_of_their_source(caches: dict[str, TokenCache]) -> None:
    cfg = _config(caches, {"a": 0.4, "b": 0.4, "c": 0.2})
    loader = MixtureLoader(caches, cfg, batch_size=8, seq_len=SEQ, seed=3)
    batch = loader.batch(5)
    src, seq = loader.sequence_indices(5)
    for row, (s, i) in enumerate(zip(src, seq, strict=True)):
        cache = loader.caches[s]
        stream = np.concatenate([[EOS], cache.read(0, cache.num_tokens)])
        assert np.array_equal(batch["inputs"][row], stream[i * SEQ : (i + 1) * SEQ])
        assert np.array_equal(batch["targets"][row], stream[i * SEQ + 1 : (i + 1) * SEQ + 1])
    assert batch["loss_mask"].shape == (8, SEQ) and batch["loss_mask"].all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": {"a": 1.0, "z": 1.0}}, "names ['z'], which are not sources"),
        ({"weights": {"a": 0.0}}, "at least one source needs a positive weight"),
        ({"weights": {"a": -1.0, "b": 2.0}}, "finite numbers >= 0"),
        (
            {"weights": {"a": 1.0}, "stages": (MixtureStage(5, {"a": 1.0}), MixtureStage(5, {"b": 1.0}))},
            "strictly increasing",
        ),
        ({"weights": {"a": 1.0}, "stages": (MixtureStage(0, {"b": 1.0}),)}, "strictly increasing"),
        ({"weights": {"a": 1.0}, "block_size": 0}, "block_size"),
    ],
    ids=["unknown-source", "all-zero", "negative", "same-start", "stage-at-0", "block-size"],
)
def test_bad_mixtures_are_refused_with_the_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        MixtureConfig(sources={"a": "/x/a", "b": "/x/b"}, **kwargs)  # type: ignore[arg-type]


def test_sources_from_different_tokenizers_are_refused(
    caches: dict[str, TokenCache], tmp_path: object
) -> None:
    other = _cache(
        f"{tmp_path}/other", 5, 20, CacheHeader(tokenizer={"name": "other"}, vocab_size=1000, eos_id=0)
    )
    cfg = MixtureConfig(sources={"a": caches["a"].path, "o": other.path}, weights={"a": 1.0, "o": 1.0})
    with pytest.raises(ValueError, match="'o' .* was tokenized differently"):
        MixtureLoader({"a": caches["a"], "o": other}, cfg, batch_size=4, seq_len=SEQ, seed=0)


def test_a_source_shorter_than_one_sequence_is_named(caches: dict[str, TokenCache]) -> None:
    cfg = _config(caches, {"a": 1.0, "c": 1.0})
    with pytest.raises(ValueError, match="source 'c'"):
        MixtureLoader(caches, cfg, batch_size=4, seq_len=math.ceil(caches["c"].num_tokens + 1), seed=0)
