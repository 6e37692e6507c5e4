"""Convert the published run tables into the CSVs under tests/data/scaling/ (see README.md there).

    python tests/data/scaling/convert.py PORIAN_REPO GADRE_REPO OUT_DIR

PORIAN_REPO: a checkout of formll/resolving-scaling-law-discrepancies; GADRE_REPO: of mlfoundations/scaling.
The Porian tables are pandas pickles: they are read with an unpickler that admits only pandas and numpy
classes (a pickle can name any callable; this one names none other)."""

from __future__ import annotations

import csv
import json
import lzma
import pickle
import sys
from pathlib import Path
from typing import Any

PORIAN_CONFIG = ("base", "short", "chinchilla", "standard", "val")


class _PandasOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in ("pandas", "numpy") or (module, name) == ("builtins", "slice"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused {module}.{name}: not a pandas or numpy class")


def porian_rows(repo: Path, table: str) -> list[dict[str, Any]]:
    with lzma.open(repo / "data" / f"{table}.pickle.xz") as f:
        summary = _PandasOnly(f).load()
    rows = []
    for _, cfg in summary.iterrows():
        if tuple(cfg[k] for k in ("hparams", "warmup", "decay", "param_count", "val")) != PORIAN_CONFIG:
            continue
        for _, budget in cfg["data"].iterrows():
            if budget["orig_n"] is None:
                continue
            for n, t, loss in zip(budget["orig_n"], budget["orig_t"], budget["orig_loss"], strict=True):
                rows.append(
                    {
                        "dataset": cfg["dataset"],
                        "budget_flops": f"{float(budget['flops']):.6g}",
                        "params": f"{float(n):.0f}",
                        "tokens": f"{float(t):.10g}",
                        "loss": f"{float(loss):.6f}",
                    }
                )
    return rows


def gadre_rows(repo: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((repo / "exp_data" / "models").glob("*.json")):
        model = json.loads(path.read_text())
        hp = model["hyperparameters"]
        c4 = [r for r in model["results"] if any("c4_val" in v for v in r["val_data"])]
        if len(c4) != 1:
            raise ValueError(f"{path.name}: {len(c4)} C4 validation results, expected 1")
        rows.append(
            {
                "name": model["name"],
                "dataset": model["dataset_name"],
                "params": hp["params"],
                "params_no_embed": hp["params_no_embed"],
                "tokens": hp["tokens"],
                "multiplier": hp["chinchilla_multiplier"],
                "loss": f"{float(c4[0]['loss']):.6f}",
            }
        )
    return rows


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    porian, gadre, out = (Path(a) for a in sys.argv[1:4])
    write(out / "porian2024.csv", porian_rows(porian, "summary_df") + porian_rows(porian, "summary_df_owt2"))
    write(out / "gadre2024.csv", gadre_rows(gadre))


if __name__ == "__main__":
    main()
