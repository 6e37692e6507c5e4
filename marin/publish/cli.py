"""`marin publish --prefix P --out DIR_OR_BUCKET [--policy publish.toml] [--anonymous] [--check]`.

Builds (incrementally) the static site of the experiments the policy makes public; `--check` lists what
would be rendered or deleted and which experiments the policy hides, and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys

from marin.dashboard.cli import resolve_prefix
from marin.publish.policy import PolicyError, load_policy
from marin.publish.site import publish


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marin publish", description="Build the static public site of a prefix.")
    p.add_argument("--prefix", default=None, help="local path, gs://... or s3://... (default: $MARIN_PREFIX)")
    p.add_argument("--out", required=True, help="output directory or bucket path (gs://bucket/site)")
    p.add_argument("--policy", default="publish.toml", help="the visibility policy (default: publish.toml)")
    p.add_argument("--anonymous", action="store_true", help="double-blind: no names, no org, no repo links")
    p.add_argument("--check", action="store_true", help="list what would change and what is hidden")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"marin publish: {e}", file=sys.stderr)
        return 2
    prefix = resolve_prefix(args.prefix)
    out = args.out if "://" in args.out else str(args.out)
    report = publish(prefix, out, policy, anonymous=args.anonymous, check=args.check)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 1 if report.problems else 0
    verb = "would render" if args.check else "rendered"
    print(f"marin publish: {report.pages} pages; {verb} {len(report.rendered)}, wrote {len(report.written)}, "
          f"deleted {len(report.deleted)} ({report.seconds:.1f} s) -> {report.out}")
    for f in report.rendered if args.check else []:
        print(f"  changed  {f}")
    for f in report.deleted:
        print(f"  {'would delete' if args.check else 'deleted'}  {f}")
    print(f"  hidden by the policy: {len(report.hidden)} experiment(s)" +
          ("".join(f"\n    {h}" for h in report.hidden) if args.check else ""))
    for p in report.problems:
        print(f"  problem: {p}", file=sys.stderr)
    return 1 if report.problems else 0
