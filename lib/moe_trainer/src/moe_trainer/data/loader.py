"""Packed training batches in Feistel order, sequential evaluation batches, and a prefetching iterator.

The stream. The loader reads the cache as one token stream with a virtual EOS in front: ``[eos] + tokens``.
Every document in the cache ends with EOS, so every document in the stream is preceded by an EOS that serves
as its beginning-of-document marker. Training sequence ``i`` is the window ``stream[i*S : i*S + S + 1]``:
``inputs = window[:-1]``, ``targets = window[1:]``; there are ``num_tokens // S`` sequences (tail tokens that
do not fill a window are not trained on in that epoch).

Document boundaries. ``segment_ids`` give each input position its document within the window (renumbered from
0); the model must not attend across segments. An EOS *input* belongs to the document it begins (not the one
it ends), so:

* the last token of document d predicts d's EOS, conditioned on d only (the model learns where documents end);
* an EOS input predicts the first token of the next document from nothing but that EOS (an unconditional
  "start of document" prediction; no information crosses the boundary).

So every target is a legitimate prediction and ``loss_mask`` is 1 on every training position. In evaluation
each token of the cache (EOS included) is a target exactly once, which is what bits-per-byte needs: the summed
loss of all targets over the UTF-8 bytes of the original documents. Padding (only in the last evaluation
batch) has ``inputs = targets = eos``, ``segment_ids = -1`` and ``loss_mask = 0``.

Order. Global position ``j = step * B + row`` reads sequence ``perm_e(j mod num_sequences)`` of epoch
``e = j // num_sequences``, where ``perm_e`` is the Feistel permutation keyed by ``(seed, e)``.
``batch(step)`` depends on ``step`` alone, so a resumed run gets exactly the batches an uninterrupted one
would.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from moe_trainer.data.cache import TokenCache
from moe_trainer.data.permutation import FeistelPermutation

Batch = dict[str, np.ndarray]


def _window(cache: TokenCache, q0: int, length: int) -> np.ndarray:
    """Stream positions [q0, q0 + length) as int32, where stream = [eos] + cache tokens (caller keeps it in
    range)."""
    out = np.empty(length, dtype=np.int32)
    if q0 == 0:
        out[0] = cache.eos_id
        out[1:] = cache.read(0, length - 1)
    else:
        out[:] = cache.read(q0 - 1, q0 - 1 + length)
    return out


def _segments(doc_starts: np.ndarray, q0: int, length: int) -> np.ndarray:
    """Document ids (from 0) of stream positions [q0, q0 + length).

    Stream position q holds cache token q-1; the EOS at stream position doc_starts[k] (the end of document
    k-1) begins document k, so a new segment starts at each doc_starts[k] >= 1 inside the range.
    """
    lo = int(np.searchsorted(doc_starts, q0 + 1, side="left"))
    hi = int(np.searchsorted(doc_starts, q0 + length, side="left"))
    marks = np.zeros(length, dtype=np.int32)
    np.add.at(marks, doc_starts[lo:hi] - q0, 1)
    return np.cumsum(marks, dtype=np.int32)


def sequence_rows(cache: TokenCache, seqs: np.ndarray, seq_len: int) -> Batch:
    """The training rows of sequences ``seqs`` of ``cache`` (sequence i = stream window [i*S, i*S + S])."""
    s = seq_len
    windows = np.stack([_window(cache, int(i) * s, s + 1) for i in seqs]) if len(seqs) else \
        np.empty((0, s + 1), np.int32)
    segs = np.stack([_segments(cache.doc_starts, int(i) * s, s) for i in seqs]) if len(seqs) else \
        np.empty((0, s), np.int32)
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:], "segment_ids": segs,
            "loss_mask": np.ones((len(seqs), s), dtype=np.float32)}


def epoch_order(perm: Callable[[int], FeistelPermutation], num_sequences: int, j: np.ndarray) -> np.ndarray:
    """Sequence read at stream position ``j`` of a source: ``perm(e)(j mod N)`` in epoch ``e = j // N``."""
    epochs, within = np.divmod(j, num_sequences)
    out = np.empty_like(j)
    for e in np.unique(epochs):  # a batch straddles at most a couple of epochs
        sel = epochs == e
        out[sel] = perm(int(e))(within[sel])
    return out


class TrainLoader:
    """Batches ``{"inputs", "targets", "segment_ids", "loss_mask"}`` of shape [B, S] for any step,
    statelessly.

    With several data-parallel processes, each asks for its own rows: ``process_index``/``process_count``
    split the global batch of ``batch_size`` rows into equal contiguous parts.
    """

    def __init__(self, cache: TokenCache, batch_size: int, seq_len: int, seed: int, *,
                 process_index: int = 0, process_count: int = 1) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
        if batch_size % process_count or not 0 <= process_index < process_count:
            raise ValueError(f"batch_size {batch_size} must split evenly over process_count {process_count}, "
                             f"and process_index {process_index} must lie in [0, {process_count})")
        self.cache, self.batch_size, self.seq_len, self.seed = cache, batch_size, seq_len, seed
        self.process_index, self.process_count = process_index, process_count
        self.num_sequences = cache.num_tokens // seq_len
        if self.num_sequences < 1:
            raise ValueError(f"token cache {cache.path} holds {cache.num_tokens} tokens, fewer than one "
                             "sequence "
                             f"of seq_len={seq_len}; tokenize more data or lower seq_len")
        self._perms: dict[int, FeistelPermutation] = {}

    def permutation(self, epoch: int) -> FeistelPermutation:
        if epoch not in self._perms:  # tiny objects; a run touches a handful of epochs
            self._perms[epoch] = FeistelPermutation(self.num_sequences, self.seed, epoch)
        return self._perms[epoch]

    def describe(self) -> dict[str, Any]:
        """What a run manifest records to reproduce the data order."""
        return {"cache": self.cache.path, "num_tokens": self.cache.num_tokens, "seq_len": self.seq_len,
                "batch_size": self.batch_size, "num_sequences": self.num_sequences,
                "permutation": self.permutation(0).describe() | {"epoch": "per-epoch key (seed, epoch)"}}

    def sequence_indices(self, step: int) -> np.ndarray:
        """The sequence index read by each of this process's rows at ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        rows = self.batch_size // self.process_count
        j = step * self.batch_size + self.process_index * rows + np.arange(rows, dtype=np.int64)
        return epoch_order(self.permutation, self.num_sequences, j)

    def batch(self, step: int) -> Batch:
        return sequence_rows(self.cache, self.sequence_indices(step), self.seq_len)

    def iterate(self, start_step: int = 0, num_steps: int | None = None, prefetch: int = 4) -> Prefetcher:
        """Batches for ``start_step, start_step + 1, ...`` computed ahead on a background thread."""
        stop = None if num_steps is None else start_step + num_steps
        return Prefetcher(self.batch, start_step, stop, depth=prefetch)


class EvalLoader:
    """Sequential, non-overlapping evaluation windows: every cache token is a target exactly once.

    Window k covers stream positions ``[k*S, k*S + S]``; the last window is shorter and padded, and rows past
    the last window are all padding (``loss_mask`` 0). ``num_bytes``/``domains`` come from the manifest for
    bits-per-byte: ``bpb = sum(loss * loss_mask) / (ln 2 * num_bytes)``.
    """

    def __init__(self, cache: TokenCache, batch_size: int, seq_len: int) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
        self.cache, self.batch_size, self.seq_len = cache, batch_size, seq_len
        self.num_windows = -(-cache.num_tokens // seq_len)
        self.num_batches = -(-self.num_windows // batch_size)

    @property
    def num_targets(self) -> int:
        return self.cache.num_tokens

    @property
    def num_bytes(self) -> int:
        return self.cache.num_bytes

    def batch(self, k: int) -> Batch:
        if not 0 <= k < self.num_batches:
            raise IndexError(f"evaluation batch {k} outside [0, {self.num_batches}) for cache "
                             f"{self.cache.path}")
        b, s, eos = self.batch_size, self.seq_len, self.cache.eos_id
        out = {"inputs": np.full((b, s), eos, np.int32), "targets": np.full((b, s), eos, np.int32),
               "segment_ids": np.full((b, s), -1, np.int32), "loss_mask": np.zeros((b, s), np.float32)}
        for row in range(b):
            w = k * b + row
            if w >= self.num_windows:
                break
            q0 = w * s
            n = min(s, self.cache.num_tokens - q0)  # targets q0+1 .. q0+n, all inside the stream
            window = _window(self.cache, q0, n + 1)
            out["inputs"][row, :n], out["targets"][row, :n] = window[:-1], window[1:]
            out["segment_ids"][row, :n] = _segments(self.cache.doc_starts, q0, n)
            out["loss_mask"][row, :n] = 1.0
        return out

    def __iter__(self) -> Iterator[Batch]:
        return iter(Prefetcher(self.batch, 0, self.num_batches, depth=2))


class _Done:
    """The end-of-stream marker the producer thread queues after its last batch."""


_DONE = _Done()
_Item = Batch | BaseException | _Done  # what the producer thread hands the consumer


def _put(q: queue.Queue[_Item], closed: threading.Event, item: _Item) -> bool:
    while not closed.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _produce(fn: Callable[[int], Batch], start: int, stop: int | None, q: queue.Queue[_Item],
             closed: threading.Event) -> None:
    # a plain function, not a method: the thread must not keep the Prefetcher alive, so that dropping the
    # iterator (its __del__) stops the thread
    k = start
    while stop is None or k < stop:
        try:
            item = fn(k)
        except BaseException as e:  # handed to the consumer, which re-raises it
            _put(q, closed, e)
            return
        if not _put(q, closed, item):
            return
        k += 1
    _put(q, closed, _DONE)


class Prefetcher:
    """Calls ``fn(k)`` for k = start, start+1, ... (up to ``stop``) on a background thread, ``depth`` ahead.

    Errors raised by ``fn`` are re-raised in the consuming thread at the batch where they happened.
    ``close()``, leaving a ``with`` block, or dropping the iterator stops the thread (a daemon, so it never
    blocks exit).
    """

    def __init__(self, fn: Callable[[int], Batch], start: int, stop: int | None, depth: int = 4) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=_produce, args=(fn, start, stop, self._queue, self._closed),
                                        name="batch-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Batch:
        if self._closed.is_set():
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _Done):
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        self._closed.set()

    def __del__(self) -> None:
        self._closed.set()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
