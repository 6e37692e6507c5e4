"""`marin predictions [--prefix P] [--format table|json]`: every pre-registered prediction under a prefix.

One row per ``prediction.json`` found under the prefix: whether its content still matches its hash, where
it was posted, the forecast at the scored point with its interval, and, once scored, the actual value, the
signed error and whether it fell inside; then the hit rate of the scored intervals (a calibrated ladder
hits about 90% of the time). A record whose hash does not match is listed as TAMPERED.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from marin.errors import NoExperimentsError
from marin.status.manifest import require_manifests
from marin.storage.fs import normalize_prefix, storage_for
from marin.tracking.predictions import list_predictions
from openlab_records import Posted


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marin predictions", description=__doc__.splitlines()[0])
    p.add_argument(
        "--prefix", default=None, help="the prefix to search (default: $MARIN_PREFIX or ./marin-out)"
    )
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")
    return p


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "—" if v is None else format(v, spec)


def table(listing: dict[str, Any]) -> str:
    lines = [
        f"{'experiment':<16} {'target':<10} {'sha256':<12} {'predicted':>9} {'interval':<19} {'actual':>8} "
        f"{'error':>8} {'hit':<7} posted"
    ]
    for r in listing["predictions"]:
        if not r["verified"]:
            lines.append(
                f"{'?':<16} {'?':<10} {str(r['sha256'])[:12]:<12} TAMPERED: {r['path']} does not match "
                "its record_sha256"
            )
            continue
        interval = f"[{_fmt(r['low'])}, {_fmt(r['high'])}]"
        hit = "—" if r["inside"] is None else ("inside" if r["inside"] else "OUTSIDE")
        posted = Posted.from_json(r["posted"]).issue if r["posted"] else "not posted"
        lines.append(
            f"{str(r['experiment'])[:16]:<16} {str(r['target'])[:10]:<10} {r['sha256'][:12]:<12} "
            f"{_fmt(r['point']):>9} {interval:<19} {_fmt(r['actual']):>8} "
            f"{_fmt(r['error_pct'], '+.2f') + '%' if r['error_pct'] is not None else '—':>8} {hit:<7} "
            f"{posted}"
        )
        if r.get("error_words"):
            lines.append(f"{'':<16} {r['error_words']}")
        if r.get("gates_flagged"):
            lines.append(f"{'':<16} gates fired before the run: {', '.join(r['gates_flagged'])}")
        if r.get("rules_line"):
            lines.append(f"{'':<16} {r['rules_line']}")
    rate = listing["hit_rate"]
    lines.append(
        f"{len(listing['predictions'])} predictions, {listing['scored']} scored"
        + (f", 90% intervals hit {rate:.0%}" if rate is not None else "")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    prefix = args.prefix or os.environ.get("MARIN_PREFIX") or "./marin-out"
    normalized = normalize_prefix(prefix)
    if "://" not in prefix and not os.path.isdir(prefix):
        raise NoExperimentsError(normalized)  # a wrong --prefix: the one error of every read command
    listing = list_predictions(prefix)
    if not listing["predictions"]:
        require_manifests(storage_for(normalized), normalized)
    print(json.dumps(listing, indent=1, default=str) if args.format == "json" else table(listing))
    return 0
