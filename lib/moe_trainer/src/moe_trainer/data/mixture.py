"""Weighted mixtures of token caches, with weights that may change by step (stages), drawn statelessly.

A mixture trains on several token caches ("sources", e.g. code and prose, or a pretraining mix and a
high-quality cooldown set) in proportions given by weights; ``stages`` switch to other weights from a given
step on (Marin's two-phase runs: pretraining, then a cooldown with more high-quality data).

Which source a row reads. Global row ``j = step * B + row`` of the run belongs to the stage whose first row
``start_step * B`` is the last one <= j; within the stage, rows are cut into blocks of ``block_size`` = K
rows. Each block holds exactly ``c_s`` rows of source s, where ``c`` is the largest-remainder rounding of ``K
* w / sum(w)`` (ties go to the source listed first), so over every whole block the realised proportions equal
the weights to within 1/K, and the order of the rows inside a block is a Feistel permutation of the K
positions keyed by ``(seed, stage, block)``: position p of the block belongs to source s when ``C_{s-1} <= p <
C_s`` (C the cumulative counts), and offset o of the block reads position ``perm(o)``. Over a part of a block
the counts follow the hypergeometric distribution (the sampling error the tests allow).

Which sequence of the source. Every source keeps its own stream of sequence indices ``i_s = 0, 1, 2, ...`` in
the order its rows occur in the run: the i-th row drawn from s reads position i of s's own Feistel order,
``perm_{(seed, e)}(i mod N_s)`` in epoch ``e = i // N_s``, exactly as ``TrainLoader`` reads a single cache
(a one-source mixture gives the TrainLoader's batches). So each source has its own order and epoch count, and
a stage change neither restarts nor skips any source. ``i_s`` of a row is computed, not counted: the rows of s
before the current stage (a per-stage base, O(stages) to compute once), plus ``c_s`` per whole block before
the row's block, plus the rank of the row among the block's rows of s. Everything is a function of the step
index and the seed, so nothing needs saving and a resumed run gets exactly the batches of an uninterrupted
one.

``tokens_seen(step)`` (the number of training targets each source has contributed in steps ``[0, step)``) is
computed the same way; the trainer writes it to metrics.jsonl as ``tokens/{source}`` and the epoch count as
``epoch/{source}``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from moe_trainer.data.cache import TokenCache
from moe_trainer.data.loader import Batch, Prefetcher, epoch_order, sequence_rows
from moe_trainer.data.permutation import FeistelPermutation, _splitmix64_int

MIX_SCHEME = "block-feistel-v1"  # recorded by describe(); bump if the row -> source rule ever changes
_MIX_TAG = 0x4D49585455524553  # "MIXTURES": separates the mixing keys from the sources' own order keys


def _fail(field: str, value: object, fix: str) -> None:
    raise ValueError(f"MixtureConfig.{field}={value!r} is invalid: {fix}")


@dataclasses.dataclass(frozen=True)
class MixtureStage:
    """Weights that apply from ``start_step`` on (until the next stage's start)."""

    start_step: int = 0
    """First step (0-based batch index) drawn with these weights."""
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    """Relative weights by source name (normalised by their sum; a source left out has weight 0)."""


@dataclasses.dataclass(frozen=True)
class MixtureConfig:
    """Several training token caches mixed by weight, optionally with weights changing by step."""

    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    """Token caches by source name, e.g. {python: /caches/train/python, prose: gs://b/train/prose}."""
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    """Relative weights by source from step 0 (normalised; a source left out has weight 0)."""
    stages: tuple[MixtureStage, ...] = ()
    """Later stages, e.g. [{start_step: 900, weights: {python: 0.5, prose: 0.5}}] for a cooldown mix; their
    start steps must increase."""
    block_size: int = 1024
    """Rows per mixing block: every block holds exactly round(weight * block_size) rows of each source."""

    def __post_init__(self) -> None:
        if not self.sources:
            if self.weights or self.stages:
                _fail("sources", self.sources, "name the token cache of every weighted source")
            return
        if self.block_size < 1:
            _fail(
                "block_size", self.block_size, "must be >= 1 (rows per mixing block; 1024 is a good default)"
            )
        starts = [0] + [st.start_step for st in self.stages]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            _fail(
                "stages",
                [st.start_step for st in self.stages],
                "stage start_steps must be > 0 and strictly increasing (stage 0 is `weights`, from step 0)",
            )
        for where, w in [("weights", self.weights)] + [
            (f"stages[{i}].weights", st.weights) for i, st in enumerate(self.stages)
        ]:
            unknown = sorted(set(w) - set(self.sources))
            if unknown:
                _fail(where, w, f"names {unknown}, which are not sources; sources: {sorted(self.sources)}")
            bad = {k: v for k, v in w.items() if not (isinstance(v, int | float) and v >= 0 and v == v)}
            if bad:
                _fail(where, w, f"weights must be finite numbers >= 0; bad: {bad}")
            if not sum(w.values()) > 0:
                _fail(where, w, "at least one source needs a positive weight")

    @property
    def enabled(self) -> bool:
        return bool(self.sources)

    def schedule(self) -> tuple[MixtureStage, ...]:
        """Every stage, the first one (``weights`` from step 0) included."""
        return (MixtureStage(0, dict(self.weights)), *self.stages)


def block_counts(weights: Mapping[str, float], names: Sequence[str], block_size: int) -> np.ndarray:
    """Rows of each source in one block of ``block_size``: largest-remainder rounding of the normalised
    weights
    (ties to the source listed first), so the counts sum to block_size exactly."""
    w = np.array([float(weights.get(n, 0.0)) for n in names], dtype=np.float64)
    exact = w / w.sum() * block_size
    counts: npt.NDArray[np.int64] = np.floor(exact).astype(np.int64)
    short = block_size - int(counts.sum())
    order = sorted(range(len(names)), key=lambda s: (-(exact[s] - counts[s]), s))
    for s in order[:short]:
        counts[s] += 1
    return counts


class MixtureSampler:
    """Which source, and which position of that source's own stream, every global row reads (no data access).

    ``stages`` are (start_step, weights) pairs, the first starting at 0; see the module docstring for the
    rule.
    """

    def __init__(
        self,
        names: Sequence[str],
        stages: Sequence[MixtureStage],
        batch_size: int,
        block_size: int,
        seed: int,
    ) -> None:
        self.names, self.batch_size, self.block_size, self.seed = list(names), batch_size, block_size, seed
        self.stage_rows = np.array([st.start_step * batch_size for st in stages], dtype=np.int64)
        self.counts = np.stack([block_counts(st.weights, self.names, block_size) for st in stages])
        self.bounds = np.cumsum(self.counts, axis=1)  # [stages, sources]: C_s of each stage
        self._block = lru_cache(maxsize=16)(self._block_uncached)
        bases = [np.zeros(len(self.names), np.int64)]
        for k in range(len(stages) - 1):
            bases.append(bases[-1] + self._consumed(k, int(self.stage_rows[k + 1] - self.stage_rows[k])))
        self.bases = np.stack(bases)

    def _block_uncached(self, stage: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(source id, rank among the block's rows of that source) of every offset of one block."""
        key = _splitmix64_int((self.seed ^ _MIX_TAG) + stage)
        positions = FeistelPermutation(self.block_size, key, block)(
            np.arange(self.block_size, dtype=np.int64)
        )
        labels = np.searchsorted(self.bounds[stage], positions, side="right")
        ranks = np.empty(self.block_size, np.int64)
        for s in range(len(self.names)):
            sel = np.flatnonzero(labels == s)
            ranks[sel] = np.arange(sel.size)
        return labels, ranks

    def _consumed(self, stage: int, rows: int) -> np.ndarray:
        """Rows of each source among the first ``rows`` rows of ``stage``."""
        full, rem = divmod(rows, self.block_size)
        out: npt.NDArray[np.int64] = self.counts[stage] * full
        if rem:
            out = out + np.bincount(self._block(stage, full)[0][:rem], minlength=len(self.names))
        return out

    def rows(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, position in that source's stream) of global rows ``j`` (int64 array)."""
        stage = np.searchsorted(self.stage_rows, j, side="right") - 1
        blocks, offsets = np.divmod(j - self.stage_rows[stage], self.block_size)
        src, pos = np.empty_like(j), np.empty_like(j)
        for k, b in sorted({(int(k), int(b)) for k, b in zip(stage, blocks, strict=True)}):
            sel = (stage == k) & (blocks == b)
            labels, ranks = self._block(k, b)
            s = labels[offsets[sel]]
            src[sel] = s
            pos[sel] = self.bases[k][s] + b * self.counts[k][s] + ranks[offsets[sel]]
        return src, pos

    def rows_seen(self, step: int) -> np.ndarray:
        """Rows each source contributed to steps ``[0, step)``."""
        j = step * self.batch_size
        k = int(np.searchsorted(self.stage_rows, j, side="right") - 1)
        seen: npt.NDArray[np.int64] = self.bases[k] + self._consumed(k, int(j - self.stage_rows[k]))
        return seen


class MixtureLoader:
    """``TrainLoader``'s interface over a mixture: ``batch(step)`` of [B, S] arrays, statelessly.

    ``process_index``/``process_count`` split the global batch into equal contiguous row ranges, as in
    ``TrainLoader``; the mixing rule is over global rows, so the split does not change what is drawn.
    """

    def __init__(
        self,
        caches: Mapping[str, TokenCache],
        config: MixtureConfig,
        batch_size: int,
        seq_len: int,
        seed: int,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
        if batch_size % process_count or not 0 <= process_index < process_count:
            raise ValueError(
                f"batch_size {batch_size} must split evenly over process_count {process_count}, "
                f"and process_index {process_index} must lie in [0, {process_count})"
            )
        if set(caches) != set(config.sources):
            raise ValueError(
                f"caches {sorted(caches)} do not match the mixture's sources {sorted(config.sources)}"
            )
        self.names = list(config.sources)
        self.caches = [caches[n] for n in self.names]
        _check_compatible(self.names, self.caches)
        self.config, self.batch_size, self.seq_len, self.seed = config, batch_size, seq_len, seed
        self.process_index, self.process_count = process_index, process_count
        self.num_sequences = [c.num_tokens // seq_len for c in self.caches]
        for name, cache, n in zip(self.names, self.caches, self.num_sequences, strict=True):
            if n < 1:
                raise ValueError(
                    f"mixture source {name!r} ({cache.path}) holds {cache.num_tokens} tokens, fewer "
                    f"than one sequence of seq_len={seq_len}; tokenize more data, lower seq_len or "
                    "remove the source"
                )
        self.sampler = MixtureSampler(self.names, config.schedule(), batch_size, config.block_size, seed)
        self._perms: list[dict[int, FeistelPermutation]] = [{} for _ in self.names]

    def _perm(self, s: int, epoch: int) -> FeistelPermutation:
        if epoch not in self._perms[s]:
            self._perms[s][epoch] = FeistelPermutation(self.num_sequences[s], self.seed, epoch)
        return self._perms[s][epoch]

    def sequence_indices(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(source id, sequence index in that source's cache) of each of this process's rows at ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        rows = self.batch_size // self.process_count
        j = step * self.batch_size + self.process_index * rows + np.arange(rows, dtype=np.int64)
        src, pos = self.sampler.rows(j)
        seqs = np.empty_like(pos)
        for s in map(int, np.unique(src)):
            sel = src == s
            seqs[sel] = epoch_order(functools.partial(self._perm, s), self.num_sequences[s], pos[sel])
        return src, seqs

    def batch(self, step: int) -> Batch:
        src, seqs = self.sequence_indices(step)
        out: Batch = {}
        for s in np.unique(src):
            sel = np.flatnonzero(src == s)
            part = sequence_rows(self.caches[int(s)], seqs[sel], self.seq_len)
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((len(src), *value.shape[1:]), value.dtype)
                out[key][sel] = value
        return out

    def tokens_seen(self, step: int) -> dict[str, int]:
        """Training targets each source contributed to steps ``[0, step)`` (all processes together)."""
        return {
            n: int(r) * self.seq_len for n, r in zip(self.names, self.sampler.rows_seen(step), strict=True)
        }

    def epochs(self, step: int) -> dict[str, float]:
        """Passes over each source's sequences completed by steps ``[0, step)``."""
        rows = self.sampler.rows_seen(step)
        return {
            n: float(r) / self.num_sequences[i] for i, (n, r) in enumerate(zip(self.names, rows, strict=True))
        }

    def progress(self, step: int) -> dict[str, float]:
        """The metrics row entries after ``step`` steps: ``tokens/{source}`` and ``epoch/{source}``."""
        out: dict[str, float] = {f"tokens/{n}": float(t) for n, t in self.tokens_seen(step).items()}
        out.update({f"epoch/{n}": e for n, e in self.epochs(step).items()})
        return out

    def describe(self) -> dict[str, Any]:
        """What a run manifest records to reproduce the data order."""
        return {
            "mixture": MIX_SCHEME,
            "block_size": self.config.block_size,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "stages": [
                {"start_step": st.start_step, "block_counts": dict(zip(self.names, map(int, c), strict=True))}
                for st, c in zip(self.config.schedule(), self.sampler.counts, strict=True)
            ],
            "sources": {
                n: {"cache": c.path, "num_tokens": c.num_tokens, "num_sequences": k}
                for n, c, k in zip(self.names, self.caches, self.num_sequences, strict=True)
            },
        }

    def iterate(self, start_step: int = 0, num_steps: int | None = None, prefetch: int = 4) -> Prefetcher:
        """Batches for ``start_step, start_step + 1, ...`` computed ahead on a background thread."""
        stop = None if num_steps is None else start_step + num_steps
        return Prefetcher(self.batch, start_step, stop, depth=prefetch)


def _check_compatible(names: Sequence[str], caches: Sequence[TokenCache]) -> None:
    """All sources must come from one tokenizer: same EOS id and tokenizer identity."""
    first = caches[0]
    for name, c in zip(names[1:], caches[1:], strict=True):
        same_tok = c.manifest.get("tokenizer") == first.manifest.get("tokenizer")
        if c.eos_id != first.eos_id or not same_tok:
            raise ValueError(
                f"mixture source {name!r} ({c.path}) was tokenized differently from {names[0]!r} "
                f"({first.path}): eos_id {c.eos_id} vs {first.eos_id}, tokenizer "
                f"{c.manifest.get('tokenizer')} vs {first.manifest.get('tokenizer')}; tokenize every "
                "source with the same tokenizer"
            )


def open_mixture(
    config: MixtureConfig, batch_size: int, seq_len: int, seed: int, **split: int
) -> MixtureLoader:
    """A MixtureLoader over the caches named by ``config.sources``."""
    return MixtureLoader(
        {n: TokenCache(p) for n, p in config.sources.items()}, config, batch_size, seq_len, seed, **split
    )
