"""`marin verdict EXPERIMENT [OUTCOME] [--note TEXT] [--by WHO] [--prefix P] [--recompute] [--no-post]`.

Without OUTCOME: print the experiment's current verdict and its history. With OUTCOME (one of
`worked, did_not_work, mixed, inconclusive, not_evaluated, infra_failure`): record a person's verdict (who:
`--by`, else `git config user.name`, else $USER; when: now), appended to the history in
`{prefix}/experiments/{id}/verdicts.json`; it stays current until a person sets another (docs/notebook.md).
`--recompute` judges the criterion again from the files under the prefix (after a late evaluation, or once a
lost driver was recorded). Then, unless `--no-post`, the experiment's issue gets the verdict label
(`marin:worked`, ... replacing the previous one) and the verdict section of its status comment is replaced.

EXPERIMENT is an experiment id (`exp2_tiny_moe_aux_free-0a1b2c3d`) or an unambiguous start of one. A verdict
that contradicts the computed one (the criterion said `did_not_work`, the person says `worked`) needs a
non-empty `--note` saying why. `--format json` prints the verdicts document (docs/formats.md).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from marin.colour import word
from marin.definition.criterion import OUTCOMES
from marin.errors import NoExperimentsError
from marin.issue_ref import IssueRef
from marin.status import files as sf
from marin.status import verdicts
from marin.status.manifest import manifest_path, require_manifests
from marin.storage.base import Storage
from marin.storage.fs import normalize_prefix, storage_for
from marin.tracking.base import TrackerError, TrackerNotFound
from marin.tracking.cli import resolve_prefix
from marin.tracking.comment import marker
from marin.tracking.factory import choose_backend, make_tracker
from marin.tracking.local import LocalTracker
from marin.tracking.notebook import notebook_section, set_verdict_label, splice


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marin verdict", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="experiment id, or an unambiguous start of one")
    p.add_argument("outcome", nargs="?", choices=OUTCOMES, help="the verdict to record")
    p.add_argument("--note", default="", help="why (one or two sentences; shown on the issue and dashboard)")
    p.add_argument("--by", help="who decides (default: git config user.name, else $USER)")
    p.add_argument("--prefix", help="the prefix (default: $MARIN_PREFIX or ./marin-out)")
    p.add_argument("--recompute", action="store_true", help="judge the frozen criterion again from the files")
    p.add_argument("--no-post", action="store_true", help="record only; do not touch the issue")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")
    return p


def who(explicit: str | None) -> str:
    if explicit and explicit.strip():
        return explicit.strip()
    try:
        name = subprocess.run(["git", "config", "user.name"], capture_output=True, text=True, timeout=5,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    return name or os.environ.get("USER") or getpass.getuser() or "unknown"


def find_experiment(storage: Storage, prefix: str, name: str) -> dict[str, Any]:
    exact = sf.read_record(storage, manifest_path(prefix, name))
    if exact is not None:
        return exact
    found = [m for m in require_manifests(storage, prefix) if str(m.get("id", "")).startswith(name)]
    if len(found) == 1:
        return found[0]
    known = ", ".join(str(m.get("id")) for m in found[:10]) if found else "none match"
    raise ValueError(f"experiment {name!r} is {'ambiguous' if found else 'not'} under {prefix} ({known}). "
                     "Fix: give the full id (see `marin catalogue`)")


def post(prefix: str, manifest: dict[str, Any], doc: dict[str, Any]) -> str:
    """Move the verdict label and replace the status comment's section; returns what was done."""
    issue_text = manifest.get("issue")
    ref = IssueRef.parse(issue_text) if isinstance(issue_text, str) and issue_text else None
    if ref is None or choose_backend(ref.repo) == "off":
        return "no issue linked (or the tracker is off): nothing posted"
    tracker = make_tracker(ref.repo, prefix)
    experiment_id = str(manifest["id"])
    try:
        issue = tracker.get_issue(ref.number)
    except TrackerNotFound:
        if not isinstance(tracker, LocalTracker):
            raise
        issue = tracker.ensure_issue(ref.number, title=experiment_id, body=f"Experiment `{experiment_id}`.")
    outcome = (doc.get("current") or {}).get("outcome")
    set_verdict_label(tracker, ref.number, set(issue.labels), outcome)
    section = notebook_section(manifest, doc)
    tag = marker(experiment_id, prefix)
    managed = [c for c in tracker.list_comments(ref.number) if c.body.startswith(tag)]
    if managed:
        tracker.edit_comment(ref.number, managed[0].id, splice(managed[0].body, section))
    else:  # never published: start the managed comment (the executor's publisher takes it over)
        tracker.create_comment(ref.number, "\n".join([tag, f"### Experiment `{experiment_id}`", *section]))
    return f"posted to {ref}: label marin:{outcome}"


def show(doc: dict[str, Any] | None, experiment_id: str) -> None:
    if not doc or not doc.get("history"):
        print(f"{experiment_id}: no verdict yet (not_evaluated)")
        return
    current = doc.get("current") or {}
    outcome = str(current.get("outcome"))
    print(f"{experiment_id}: {word(outcome)} (by {current.get('by')}) {current.get('note') or ''}")
    number = verdicts.deciding(current, doc.get("history") or [])
    if number:
        print(f"  deciding: {number}")
    for e in doc["history"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.get("at") or 0))
        print(f"  {when} UTC  {e.get('source'):<8} {str(e.get('by')):<16} {e.get('outcome'):<14} "
              f"{e.get('note') or ''}")


def contradiction(doc: dict[str, Any] | None, outcome: str, note: str) -> str | None:
    """The refusal when a person's `outcome` overturns the computed verdict without a note, else None."""
    computed = verdicts.last_computed(doc)
    if note.strip() or computed is None or computed.get("outcome") in (outcome, "not_evaluated"):
        return None
    number = verdicts.deciding(computed)
    return (f"{outcome} contradicts the computed verdict {computed.get('outcome')}"
            f"{f' ({number})' if number else ''}. Fix: say why with --note '...' (shown on the issue and the "
            "dashboard beside the numbers)")


def _print(doc: dict[str, Any] | None, experiment_id: str, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(doc or {"experiment": experiment_id, "current": None, "history": []}, indent=1))
    else:
        show(doc, experiment_id)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    prefix = normalize_prefix(resolve_prefix(args.prefix))
    storage = storage_for(prefix)
    try:
        manifest = find_experiment(storage, prefix, args.experiment)
    except NoExperimentsError:
        raise  # the one error every read command gives (marin/cli.py prints it)
    except ValueError as e:
        print(f"marin verdict: {e}", file=sys.stderr)
        return 2
    experiment_id = str(manifest["id"])
    existing = verdicts.read_verdicts(storage, prefix, experiment_id)
    if args.outcome is None and not args.recompute:
        _print(existing, experiment_id, args.format)
        return 0
    refusal = contradiction(existing, args.outcome, args.note) if args.outcome is not None else None
    if refusal:
        print(f"marin verdict: error: {refusal}", file=sys.stderr)
        return 2
    if args.outcome is not None:
        entry: dict[str, Any] = {"outcome": args.outcome, "note": " ".join(args.note.split()),
                                 "by": who(args.by), "source": verdicts.PERSON, "at": time.time(),
                                 "run_id": None, "criteria": [], "infra": [],
                                 "notebook_sha256": (manifest.get("notebook") or {}).get("sha256")}
    else:
        entry = verdicts.judge(storage, prefix, manifest)
    doc = verdicts.record(storage, prefix, experiment_id, entry)
    _print(doc, experiment_id, args.format)
    if args.no_post:
        return 0
    try:
        print(post(prefix, manifest, doc), file=sys.stderr if args.format == "json" else sys.stdout)
    except (TrackerError, OSError, ValueError) as e:
        print(f"marin verdict: recorded, but not posted to {manifest.get('issue')}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    return 0
