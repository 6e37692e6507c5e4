"""`marin run --publish` (and `python SCRIPT --publish`): re-publish the site incrementally after a run.

The policy is read before the run starts (:func:`policy_for_run`), so a missing or invalid `publish.toml`
is an error before any step runs, not a surprise after hours of training. After the run (successful or not:
failures are published beside successes) :func:`publish_after_run` builds the site of the prefix into
`--publish-out` (default: `PREFIX/site`), rendering only the pages whose records changed. Like a status
publisher, a failing publish is reported (a line on stderr and an entry in the run's `publisher_errors`)
and never fails the run.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from marin.publish.policy import Policy, PolicyError, load_policy

SITE_DIR = "site"
"""--publish-out's default: this folder under the prefix."""


def policy_for_run(path: str) -> Policy:
    """The policy --publish will apply; a ValueError naming the file and the fix when it cannot be read."""
    try:
        return load_policy(path)
    except PolicyError as e:
        raise ValueError(f"--publish: {e} (or name another file with --publish-policy)") from e


def after_run_hook(config: Any) -> Callable[[str, bool], dict[str, Any] | None] | None:
    """The `marin.after_run` entry point (marin/execution/after_run.py): with --publish, the policy is read
    now (a ValueError stops the run before it starts) and the site is published after the run."""
    if not config.publish:
        return None
    policy = policy_for_run(config.publish_policy)
    out = config.publish_out
    return lambda prefix, verbose: publish_after_run(prefix, out, policy, verbose=verbose)


def site_of(prefix: str, out: str | None) -> str:
    """Where the site goes: `out`, else the `site` folder under the prefix."""
    return out or f"{prefix.rstrip('/')}/{SITE_DIR}"


def publish_after_run(prefix: str, out: str | None, policy: Policy, *, verbose: bool = True
                      ) -> dict[str, Any] | None:
    """Publish the site of `prefix`; None when it worked, else the error as a publisher error record."""
    from marin.publish.site import publish

    target = site_of(prefix, out)
    try:
        report = publish(prefix, target, policy)
    except Exception as e:  # a publish never fails the run: reported, with its cause
        print(f"marin run --publish: publishing {target} failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return {"publisher": "publish", "ts": time.time(), "final": True, "error": f"{type(e).__name__}: {e}"}
    if verbose:
        print(f"published {target}: {report.pages} pages, rendered {len(report.rendered)}, wrote "
              f"{len(report.written)}, deleted {len(report.deleted)} ({report.seconds:.1f} s)", flush=True)
    if report.problems:
        print("marin run --publish: " + "; ".join(report.problems), file=sys.stderr)
        return {"publisher": "publish", "ts": time.time(), "final": True,
                "error": "; ".join(report.problems)}
    return None
