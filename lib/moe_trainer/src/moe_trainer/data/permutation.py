"""Stateless, random-access permutations of ``[0, n)`` for the data order.

The trainer never materialises a shuffled index array: the sequence read at global position ``j`` is
``perm(j)``, computed on the spot. That gives O(1) memory, random access (a batch for step ``k`` depends on
``k`` alone, so resume is exact) and a fresh key per epoch.

``feistel_permutation`` is a keyed Feistel network over the smallest power-of-two domain ``2**bits >= n``,
with a splitmix64 finaliser as the round function and cycle-walking to land back in ``[0, n)``. Why these
choices (see docs/data.md and the research note data-scaling-eval.md §1):

* The round function must avalanche. Levanter's multiply-add round function leaves some input bits flipping
  only ~9% of output bits; the splitmix64 finaliser (two xor-shift-multiply stages) flips each output bit with
  probability ~0.5 and makes the network indistinguishable from ``numpy.random.permutation`` on the gates.
* ``ROUNDS = 6`` >= 4: Luby-Rackoff gives a strong PRP from 4 rounds of a random function; two more are cheap.
* Cycle-walking: the network is a bijection on ``[0, 2**bits)``, the next power of two >= n; re-applying it to
  outputs ``>= n`` until they fall in ``[0, n)`` restricts it to a bijection on ``[0, n)``. Because
  ``2**bits < 2n`` the expected number of passes is below 2 (an even-bit, balanced domain would allow up to
  4x: at n = 2**24 + 1 that measured 8 M indices/s instead of > 20 M). With an odd bit count the two halves
  differ by one bit and swap widths every round (an alternating unbalanced Feistel network, still a bijection
  for any round function).
* Every epoch derives its round keys from ``(seed, epoch)`` through splitmix64, so epochs get unrelated
orders.

``lcg_permutation`` (``(a*x + b) mod n``) is the affine map Levanter used first. It is kept ONLY as the
negative control of the statistical tests: every consecutive step has the same stride, which is why sorted
data showed loss "phases". Never use it to order training data.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

ROUNDS = 6
MIXER = "splitmix64-v1"  # recorded in run manifests so an order can be reproduced exactly
_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 15  # elements per inner block: keeps the temporaries in L2 cache, which doubles throughput

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _splitmix64_int(x: int) -> int:
    """splitmix64 on a Python int (used to derive round keys; exact, no numpy overflow rules involved)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def round_keys(seed: int, epoch: int, rounds: int = ROUNDS) -> list[int]:
    """The 64-bit round keys for ``(seed, epoch)``: a splitmix64 stream seeded from both numbers."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    state = _splitmix64_int((seed & _MASK64) ^ _splitmix64_int(epoch ^ 0x5EED))
    keys = []
    for _ in range(rounds):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        keys.append(_splitmix64_int(state))
    return keys


def _mix_into(r: np.ndarray, key: np.uint64, out: np.ndarray, tmp: np.ndarray) -> None:
    """out = splitmix64_finaliser(r ^ key), in place on preallocated uint64 buffers (no allocations)."""
    np.bitwise_xor(r, key, out=out)
    np.right_shift(out, _S30, out=tmp)
    np.bitwise_xor(out, tmp, out=out)
    np.multiply(out, _M1, out=out)
    np.right_shift(out, _S27, out=tmp)
    np.bitwise_xor(out, tmp, out=out)
    np.multiply(out, _M2, out=out)
    np.right_shift(out, _S31, out=tmp)
    np.bitwise_xor(out, tmp, out=out)


class FeistelPermutation:
    """A bijection on ``[0, n)``; call it on an int array of indices to get their permuted positions."""

    def __init__(self, n: int, seed: int, epoch: int = 0, rounds: int = ROUNDS) -> None:
        if n < 1:
            raise ValueError(f"permutation length n must be >= 1, got {n}")
        if rounds < 4:
            raise ValueError(f"rounds must be >= 4 for a strong pseudo-random permutation, got {rounds}")
        self.n, self.seed, self.epoch, self.rounds = int(n), int(seed), int(epoch), int(rounds)
        bits = max(2, math.ceil(math.log2(n)) if n > 1 else 2)
        self.bits = bits
        self.domain = 1 << bits
        self._keys = [np.uint64(k) for k in round_keys(self.seed, self.epoch, self.rounds)]
        # halves of bits//2 (left) and bits - bits//2 (right); they swap widths every round (unbalanced by at
        # most one bit), which keeps the domain at the next power of two: fewer than 2 walks per index
        # expected
        self._widths = (bits // 2, bits - bits // 2)

    def describe(self) -> dict[str, object]:
        """What a run manifest records to reproduce this order."""
        return {"type": "feistel", "mixer": MIXER, "rounds": self.rounds, "n": self.n, "seed": self.seed,
                "epoch": self.epoch, "domain_bits": self.bits}

    def _network(self, x: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network over ``[0, 2**bits)`` (x is uint64; a new array is returned)."""
        wl, wr = self._widths
        left: npt.NDArray[np.uint64] = np.right_shift(x, np.uint64(wr))
        right: npt.NDArray[np.uint64] = np.bitwise_and(x, np.uint64((1 << wr) - 1))
        f = np.empty_like(x)
        tmp = np.empty_like(x)
        for key in self._keys:
            # (L, R) -> (R, L ^ F(R, k)): invertible whatever F is, so each pass is a bijection on the domain
            _mix_into(right, key, f, tmp)
            np.bitwise_and(f, np.uint64((1 << wl) - 1), out=f)
            np.bitwise_xor(left, f, out=left)
            left, right = right, left
            wl, wr = wr, wl
        np.left_shift(left, np.uint64(wr), out=left)
        np.bitwise_or(left, right, out=left)
        return left

    def _network_chunked(self, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for start in range(0, x.size, _CHUNK):
            out[start:start + _CHUNK] = self._network(x[start:start + _CHUNK])
        return out

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"permutation indices must be integers, got dtype {idx.dtype}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            raise IndexError(f"permutation indices must lie in [0, {self.n}), got range "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        y = self._network_chunked(idx.reshape(-1).astype(np.uint64))
        n = np.uint64(self.n)
        # cycle-walking over the whole call at once (not per chunk): the shrinking tail of out-of-range values
        # then costs a few large numpy calls instead of many tiny ones. It terminates because the orbit of an
        # in-range index under the network returns to [0, n).
        outside = np.flatnonzero(y >= n)
        while outside.size:
            z = self._network_chunked(y[outside])
            y[outside] = z
            outside = outside[z >= n]
        return y.astype(np.int64).reshape(idx.shape)


def feistel_permutation(n: int, seed: int, epoch: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """A keyed pseudo-random bijection of ``[0, n)``: ``perm(indices) -> permuted positions`` (int64 array).

    Deterministic in ``(n, seed, epoch)``; each epoch has its own round keys and so its own order.
    """
    return FeistelPermutation(n, seed, epoch)


class LcgPermutation:
    """``x -> (a*x + b) mod n`` with ``gcd(a, n) = 1``: the NEGATIVE CONTROL for the shuffle tests only."""

    def __init__(self, n: int, seed: int, epoch: int = 0, stride: int | None = None) -> None:
        if n < 1:
            raise ValueError(f"permutation length n must be >= 1, got {n}")
        rng = np.random.default_rng([seed, epoch])
        self.n = n
        a = stride if stride is not None else (int(rng.integers(1, n)) if n > 1 else 1)
        while math.gcd(a, n) != 1:
            if stride is not None:
                raise ValueError(f"LCG stride {stride} shares a factor with n={n}; it would not be a "
                                 "bijection")
            a = int(rng.integers(1, n))
        self.a, self.b = a, int(rng.integers(0, n))

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        idx = np.asarray(indices).astype(object if self.n > 2**31 else np.int64)
        return ((idx * self.a + self.b) % self.n).astype(np.int64)


def lcg_permutation(n: int, seed: int, epoch: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """The affine permutation of Levanter's first shuffle; kept only to show, in tests, why it is bad."""
    return LcgPermutation(n, seed, epoch)
