"""`marin catalogue [--prefix P] [--outcome O ...] [--tag T ...] [--format table|json|markdown]`.

Every experiment under the prefix with its hypothesis and verdict, the counts on top (marin/status/
catalogue.py). `--outcome` keeps the given outcomes (repeatable), `--tag` the experiments carrying every
given tag; `--format markdown` prints a table to paste into a report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from marin.definition.criterion import OUTCOMES
from marin.status import catalogue
from marin.status.manifest import require_manifests
from marin.storage.fs import normalize_prefix, storage_for
from marin.tracking.cli import resolve_prefix


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marin catalogue", description=__doc__.splitlines()[0])
    p.add_argument("--prefix", help="the prefix (default: $MARIN_PREFIX or ./marin-out)")
    p.add_argument("--outcome", action="append", default=[], choices=OUTCOMES,
                   help="keep experiments with this outcome (repeatable)")
    p.add_argument("--tag", action="append", default=[], help="keep experiments with this tag (repeatable)")
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                   help="output format (default: table)")
    p.add_argument("--sort", choices=("date", "speedup"), default="date",
                   help="newest first, or ideas by compute-equivalent speedup (compute_multiplier) first")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    prefix = normalize_prefix(resolve_prefix(args.prefix))
    require_manifests(storage_for(prefix), prefix)  # a wrong --prefix: the one error of every read command
    rows = catalogue.select(catalogue.build(storage_for(prefix), prefix), args.outcome, args.tag)
    if args.sort == "speedup":
        rows = catalogue.by_speedup(rows)
    if args.format == "json":
        print(json.dumps({"prefix": prefix, **catalogue.to_json(rows)}, indent=1))
    elif args.format == "markdown":
        print(catalogue.markdown(rows), end="")
    else:
        print(catalogue.table(rows))
    return 0
