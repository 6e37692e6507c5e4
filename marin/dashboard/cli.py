"""`marin dashboard [--prefix P] [--host H] [--port 8000] [--metrics-cache-mb N]`: serve the dashboard.

Bound to loopback by default: the dashboard shows configs, logs and files, so exposing it is a decision the
user makes with --host. The prefix comes from --prefix, else MARIN_PREFIX, else ./marin-out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="marin dashboard", description="Serve the read-only status dashboard of a prefix."
    )
    p.add_argument(
        "--prefix",
        default=None,
        help="local path, gs://bucket/path or s3://bucket/path (default: $MARIN_PREFIX, else ./marin-out)",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    p.add_argument(
        "--cache-ttl",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a read file is trusted before its mtime/etag is checked again "
        "(default: 1 locally, 5 on object stores)",
    )
    p.add_argument(
        "--metrics-cache-mb",
        type=float,
        metavar="MIB",
        default=None,
        help="most memory (MiB) the parsed metrics files take; least recently used out first "
        "(default: $MARIN_DASHBOARD_METRICS_CACHE_MB, else 256; 0 keeps none)",
    )
    p.add_argument(
        "--warm-s",
        type=float,
        metavar="SECONDS",
        default=10.0,
        help="before serving, compute the verdict and headline numbers of the newest experiments for at most "
        "this long (the first list pages are then cached; the rest is computed in the background after the "
        "first list request; 0 serves at once) (default: 10)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default: info)")
    return p


def resolve_prefix(arg: str | None) -> str:
    prefix = arg or os.environ.get("MARIN_PREFIX") or "./marin-out"
    if "://" not in prefix:
        prefix = os.path.abspath(prefix)
    return prefix


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    prefix = resolve_prefix(args.prefix)
    if "://" not in prefix and not os.path.isdir(prefix):
        print(
            f"marin dashboard: prefix {prefix} does not exist; run an experiment first or pass --prefix",
            file=sys.stderr,
        )
        return 2
    from marin.dashboard.metrics import cache_bytes

    try:
        metrics_cache = cache_bytes(args.metrics_cache_mb)
    except ValueError as e:
        print(f"marin dashboard: error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from marin.dashboard import collector
    from marin.dashboard.app import create_app

    app = create_app(prefix, cache_ttl=args.cache_ttl, metrics_cache_bytes=metrics_cache)
    if args.warm_s > 0:
        from marin.dashboard.results import prewarm

        t0 = time.monotonic()
        done, total = prewarm(app.state.dash, args.warm_s)
        print(f"marin dashboard: computed the numbers of {done} of {total} experiments in "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
    collector.install()  # this process only: full collections stop stalling requests (collector.py)
    print(f"marin dashboard: serving {prefix} at http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
