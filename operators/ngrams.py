"""N-gram fingerprints for decontamination: normalisation, stable 64-bit n-gram hashes, exact sets and a numpy
Bloom filter.

Normalisation follows GPT-3's decontamination (lm-evaluation-harness ``janitor.py``): lowercase, punctuation
replaced by spaces, split on whitespace; n-grams are runs of ``n`` consecutive tokens (13 by default). Hashes
must be stable across processes and machines (a saved Bloom filter is reused later), so tokens are hashed with
blake2b, not Python's salted ``hash``; an n-gram's hash is a polynomial over its token hashes (uint64,
wrapping) passed through the splitmix64 finaliser.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from functools import lru_cache
from typing import Any

import fsspec
import numpy as np

from moe_trainer.jsonio import write_bytes_atomic, write_json_atomic

_PUNCT = re.compile(r"[^\w\s]+")
_POLY = np.uint64(0x100000001B3)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def normalize(text: str) -> list[str]:
    return _PUNCT.sub(" ", text.lower()).split()


@lru_cache(maxsize=1 << 20)
def _token_hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return np.asarray(x ^ (x >> np.uint64(31)))


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """Sorted unique uint64 hashes of the document's normalised n-grams (empty if it has fewer than n
    tokens)."""
    tokens = normalize(text)
    if len(tokens) < n:
        return np.empty(0, dtype=np.uint64)
    t = np.fromiter((_token_hash(w) for w in tokens), dtype=np.uint64, count=len(tokens))
    count = t.size - n + 1
    h = np.zeros(count, dtype=np.uint64)
    for j in range(n):
        h = h * _POLY + t[j:j + count]
    return np.unique(_mix(h))


def exact_member(sorted_set: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``h`` are in the sorted unique array ``sorted_set``."""
    if sorted_set.size == 0 or h.size == 0:
        return np.zeros(h.shape, dtype=bool)
    idx = np.searchsorted(sorted_set, h)
    idx[idx == sorted_set.size] = 0
    return np.asarray(sorted_set[idx] == h)


class BloomFilter:
    """A Bloom filter over uint64 hashes, stored as a numpy bit array (``m`` a power of two, ``k`` probes by
    double hashing). No false negatives; false positives at about ``fpr`` once ``capacity`` items are in."""

    def __init__(self, capacity: int, fpr: float) -> None:
        if capacity < 1 or not 0 < fpr < 1:
            raise ValueError(f"Bloom filter needs capacity >= 1 and 0 < fpr < 1, got {capacity} and {fpr}")
        bits = max(64, math.ceil(-capacity * math.log(fpr) / math.log(2) ** 2))
        self.m = 1 << math.ceil(math.log2(bits))
        self.k = max(1, round(self.m / capacity * math.log(2)))
        self.capacity, self.fpr, self.count = capacity, fpr, 0
        self.bits = np.zeros(self.m // 8, dtype=np.uint8)

    def _positions(self, h: np.ndarray) -> np.ndarray:
        h2 = _mix(h ^ np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
        i = np.arange(self.k, dtype=np.uint64)[:, None]
        return (h[None, :] + i * h2[None, :]) & np.uint64(self.m - 1)  # (k, items)

    def add(self, h: np.ndarray) -> None:
        pos = self._positions(h).ravel()
        np.bitwise_or.at(self.bits, (pos >> np.uint64(3)).astype(np.int64),
                         (np.uint8(1) << (pos & np.uint64(7)).astype(np.uint8)))
        self.count += int(h.size)

    def __contains__(self, item: int) -> bool:
        return bool(self.contains(np.array([item], dtype=np.uint64))[0])

    def contains(self, h: np.ndarray) -> np.ndarray:
        if h.size == 0:
            return np.zeros(0, dtype=bool)
        pos = self._positions(h)
        bit = (self.bits[(pos >> np.uint64(3)).astype(np.int64)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
        return np.asarray(bit.all(axis=0), dtype=bool)

    def meta(self) -> dict[str, Any]:
        return {"m_bits": self.m, "k": self.k, "capacity": self.capacity, "fpr": self.fpr,
                "count": self.count,
                "hash": "blake2b-64 tokens, polynomial n-gram, splitmix64 finaliser; double hashing"}

    def save(self, path: str) -> None:
        """``{path}.npy`` (the bit array, numpy format) and ``{path}.json`` (parameters)."""
        import io

        buf = io.BytesIO()
        np.save(buf, self.bits)
        write_bytes_atomic(f"{path}.npy", buf.getvalue())
        write_json_atomic(f"{path}.json", self.meta())

    @staticmethod
    def load(path: str) -> BloomFilter:
        import io

        with fsspec.open(f"{path}.json", "rb") as f:
            meta = json.load(f)
        bf = BloomFilter(meta["capacity"], meta["fpr"])
        with fsspec.open(f"{path}.npy", "rb") as f:
            bf.bits = np.load(io.BytesIO(f.read()))
        if bf.m != meta["m_bits"] or bf.k != meta["k"] or bf.bits.size * 8 != bf.m:
            raise ValueError(f"Bloom filter {path}: parameters in {path}.json do not match its bit array")
        bf.count = meta["count"]
        return bf
