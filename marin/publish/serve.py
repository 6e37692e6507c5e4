"""`marin dashboard --public --policy publish.toml [--anonymous]`: the dashboard's read-only public mode.

The same app as `marin dashboard` over the policy-filtered, redacting readers of :mod:`marin.publish.public`,
behind :class:`PublicGate` (URL rules, redaction of every response, a per-client rate limit). `marin.cli`
sends `marin dashboard --public ...` here (the dashboard package sits below publishing and never imports it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastapi import FastAPI

from marin.dashboard.app import create_app
from marin.dashboard.cli import parser as dashboard_parser
from marin.dashboard.cli import resolve_prefix
from marin.publish.policy import Policy, PolicyError, load_policy
from marin.publish.public import PublicGate, open_public


def create_public_app(prefix: str, policy: Policy, *, anonymous: bool = False, cache_ttl: float | None = None,
                      storage_options: dict[str, Any] | None = None, rate: float = 10.0,
                      burst: float = 40.0) -> FastAPI:
    """The public, read-only dashboard of `prefix` under `policy`."""
    dash, redactor = open_public(prefix, policy, anonymous=anonymous, cache_ttl=cache_ttl,
                                 storage_options=storage_options)
    app = create_app(prefix, cache_ttl=cache_ttl, storage_options=storage_options, dash=dash)
    app.state.templates.env.globals.update(public=True, public_nav=())
    app.state.redactor = redactor
    app.add_middleware(PublicGate, dash=dash, policy=policy, redactor=redactor, rate=rate, burst=burst)
    return app


def parser() -> argparse.ArgumentParser:
    p = dashboard_parser()
    p.add_argument("--public", action="store_true", required=True, help="the read-only public mode")
    p.add_argument("--policy", default=None, help="the visibility policy (publish.toml; docs/publish.md)")
    p.add_argument("--anonymous", action="store_true", help="no names, no org, no repository links")
    p.add_argument("--rate", type=float, default=10.0, help="requests per second per client (default 10)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"marin dashboard --public: {e}", file=sys.stderr)
        return 2
    prefix = resolve_prefix(args.prefix)
    import uvicorn

    app = create_public_app(prefix, policy, anonymous=args.anonymous, cache_ttl=args.cache_ttl,
                            rate=args.rate)
    print(f"marin dashboard: public view of {prefix} at http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
