"""`marin compare A [B ...] [--prefix P] [--metric loss ...] [--x step|tokens|flops] [--smooth 0.9]
[--format table|json]`.

A, B, ... are experiments or steps (by id, name, hash or output path; marin/compare/runs.py); the first is
the baseline. One name alone is compared with its baseline experiment. Prints the metrics side by side with
each difference from the baseline, the config differences field by field and each curve's final value;
`--format json` prints everything, curves included (downsampled to --max-points), for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from marin.compare import AXES, CompareError, PrefixSource, compare
from marin.compare.text import comparison_text
from marin.errors import CorruptFileError
from marin.storage.fs import normalize_prefix


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marin compare", description=(__doc__ or "").split("\n\n")[1])
    p.add_argument("runs", nargs="+", help="experiments or steps: id, name, hash or output path")
    p.add_argument("--prefix", help="the prefix (default: $MARIN_PREFIX or ./marin-out)")
    p.add_argument("--metric", action="append", default=[], help="logged metric to draw (repeatable; "
                   "default: loss)")
    p.add_argument("--x", choices=AXES, default="step", help="x axis of the curves (default: step)")
    p.add_argument("--smooth", type=float, default=None, help="EMA weight in [0, 1) (default: none)")
    p.add_argument("--max-points", type=int, default=400, help="points per curve in JSON (default: 400)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    prefix = normalize_prefix(args.prefix or os.environ.get("MARIN_PREFIX") or "marin-out")
    source = PrefixSource(prefix)
    if not source.manifests():
        print(f"marin compare: no experiments under {prefix} (no experiments/*.json); pass the --prefix "
              "your runs used (or set MARIN_PREFIX)", file=sys.stderr)
        return 2
    try:
        result = compare(source, args.runs, metrics=args.metric or ["loss"], axis=args.x, ema=args.smooth,
                         max_points=max(args.max_points, 2))
    except (CompareError, CorruptFileError, ValueError) as e:
        print(f"marin compare: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=1) if args.format == "json" else comparison_text(result))
    return 0
