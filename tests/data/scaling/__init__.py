"""Published (parameters, tokens, final loss) of real training runs, checked by hash: the real-data
calibration of the scaling fitters (benchmarks/scaling_real.py, tests/operators/test_scaling_real.py).
Provenance, licences and columns: README.md here.

    from tests.data.scaling import load
    runs = load("porian2024")     # {"rw": Runs(n, d, loss), "owt2": ...}, one entry per training data set
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
SHA256 = {
    "porian2024": "23fa7893ee8f493ad41e99a0a201e2428e67754c0b8f228c64d12ae9e8009106",
    "gadre2024": "17c317eb3e581df0e844e2d49b4f22f4b8a83a939d7517eeb9082db32e55e981",
}


@dataclasses.dataclass(frozen=True)
class Runs:
    """One training data set's runs: parameters N, tokens D, final validation loss, and the C4/val label."""

    n: np.ndarray
    d: np.ndarray
    loss: np.ndarray

    @property
    def compute(self) -> np.ndarray:
        """6·N·D."""
        return np.asarray(6.0 * self.n * self.d)

    def subset(self, mask: np.ndarray) -> Runs:
        return Runs(self.n[mask], self.d[mask], self.loss[mask])


def load(name: str) -> dict[str, Runs]:
    """The runs of one published set, by training data set; refuses a file whose sha256 is not the recorded
    one."""
    if name not in SHA256:
        raise ValueError(f"no real scaling set {name!r}; the sets are {', '.join(sorted(SHA256))}")
    path = HERE / f"{name}.csv"
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHA256[name]:
        raise ValueError(f"{path}: sha256 {digest} is not the recorded {SHA256[name]}; restore it from git")
    rows = list(csv.DictReader(raw.decode().splitlines()))
    out: dict[str, Runs] = {}
    for key in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["dataset"] == key]
        out[key] = Runs(
            n=np.array([float(r["params"]) for r in mine]),
            d=np.array([float(r["tokens"]) for r in mine]),
            loss=np.array([float(r["loss"]) for r in mine]),
        )
    return out
