"""``marin issue``: create, show and list experiment issues in the GitHub or the local tracker.

    marin issue new "Try a 2x wider router" --body "Hypothesis: ..." [--repo owner/repo] [--prefix P]
    [--write] marin issue show local/experiments#3 [--prefix P]
    marin issue list [--repo owner/repo] [--prefix P] [--state open|closed|all]

``new`` prints the issue reference, its URL and the experiment script named after it
(``experiments/exp<N>_<slug>.py``); ``--write`` also creates that file (never overwriting one). The local
tracker numbers the issue so that no script of ``--experiments-dir`` has that number already; the skeleton
is an ablation of the tutorial (marin/tracking/skeleton.py). ``show`` and ``list`` take ``--format json``;
on a prefix that holds neither a local tracker nor any experiment they give the error every read command
gives for a wrong ``--prefix``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from marin.errors import NoExperimentsError
from marin.tracking.base import Issue, Tracker, TrackerError
from marin.tracking.factory import BACKENDS, make_tracker
from marin.tracking.local import DEFAULT_LOCAL_REPO, LocalTracker
from marin.tracking.skeleton import next_number, script_path, script_skeleton, used_numbers


def resolve_prefix(prefix: str | None) -> str:
    """``--prefix``, else ``MARIN_PREFIX``, else ``./marin-out``; local paths are made absolute."""
    value = prefix or os.environ.get("MARIN_PREFIX") or "marin-out"
    return value if "://" in value else os.path.abspath(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marin issue", description=__doc__.replace("``", "`"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix",
                        help="the prefix holding the local tracker (default: $MARIN_PREFIX or ./marin-out)")
    common.add_argument("--backend", choices=[b for b in BACKENDS if b != "off"],
                        help="tracker backend (default: github when GITHUB_TOKEN is set, else local)")
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", parents=[common],
                         help="open an experiment issue and print its script skeleton")
    new.add_argument("title", help="what the experiment tries, in a few words (also names the script)")
    body = new.add_mutually_exclusive_group()
    body.add_argument("--body", default="", help="the issue text: what is tried and why")
    body.add_argument("--body-file", type=Path, metavar="FILE", help="read the issue text from this file")
    new.add_argument("--repo", help=f"owner/repo (default: $MARIN_ISSUE_REPO or {DEFAULT_LOCAL_REPO})")
    new.add_argument("--label", action="append", default=None,
                     help="label to add (repeatable; default: experiment)")
    new.add_argument("--write", action="store_true", help="also create the script under --experiments-dir")
    new.add_argument("--experiments-dir", type=Path, default=Path("experiments"), metavar="DIR",
                     help="where --write puts the script (default: ./experiments)")
    show = sub.add_parser("show", parents=[common], help="print an issue and its comments")
    show.add_argument("ref", help="owner/repo#N (or #N with $MARIN_ISSUE_REPO)")
    listing = sub.add_parser("list", parents=[common], help="list the issues of a repository")
    listing.add_argument("--repo", help=f"owner/repo (default: $MARIN_ISSUE_REPO or {DEFAULT_LOCAL_REPO})")
    listing.add_argument("--state", choices=["open", "closed", "all"], default="open",
                         help="which issues (default: open)")
    for reader in (show, listing):
        reader.add_argument("--format", choices=["table", "json"], default="table",
                            help="output format (default: table)")
    return parser


def _issue_json(issue: Issue) -> dict[str, Any]:
    return dataclasses.asdict(issue) | {"ref": issue.ref}


def _reader(repo: str | None, args: argparse.Namespace) -> Tracker:
    """The tracker `show`/`list` read; a local one must exist (NoExperimentsError for a wrong --prefix)."""
    prefix = resolve_prefix(args.prefix)
    tracker = make_tracker(repo, prefix, args.backend)
    if isinstance(tracker, LocalTracker) and not tracker.exists():
        from marin.status.manifest import require_manifests
        from marin.storage.fs import normalize_prefix, storage_for

        normalized = normalize_prefix(prefix)
        require_manifests(storage_for(normalized), normalized)
    return tracker


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _new(args: argparse.Namespace) -> int:
    body = args.body_file.read_text() if args.body_file else args.body
    tracker = make_tracker(args.repo, resolve_prefix(args.prefix), args.backend)
    labels = args.label if args.label is not None else ["experiment"]
    if isinstance(tracker, LocalTracker):
        taken = {i.number for i in tracker.list_issues("all")} if tracker.exists() else set()
        issue = tracker.create_issue(args.title, body, labels=labels,
                                     number=next_number(taken, args.experiments_dir))
    else:  # the tracker numbers it: warn when a script already uses that number
        issue = tracker.create_issue(args.title, body, labels=labels)
        if issue.number in used_numbers(args.experiments_dir):
            print(f"warning: {args.experiments_dir}/exp{issue.number}_*.py already exists for another "
                  "experiment; rename one of them", file=sys.stderr)
    path = script_path(args.experiments_dir, issue.number, issue.title)
    text = script_skeleton(issue, str(path))
    print(f"created {issue.ref}: {issue.title}")
    print(f"url: {issue.url}")
    if args.write:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "x") as handle:
                handle.write(text)
        except FileExistsError:
            print(f"error: {path} already exists; not overwritten", file=sys.stderr)
            return 1
        print(f"wrote {path}")
        print(f"next: edit its CHANGE and hypothesis, then `marin plan {path}` and `marin run {path}`")
    else:
        print(f"script skeleton: {path} (create it with --write)\n")
        print(text, end="")
    return 0


def _show(args: argparse.Namespace) -> int:
    from marin.issue_ref import IssueRef

    ref = IssueRef.parse(args.ref)
    tracker = _reader(ref.repo, args)
    issue = tracker.get_issue(ref.number)
    if args.format == "json":
        comments = [dataclasses.asdict(c) for c in tracker.list_comments(ref.number)]
        print(json.dumps({**_issue_json(issue), "comments": comments}, indent=1))
        return 0
    labels = f" [{', '.join(issue.labels)}]" if issue.labels else ""
    print(f"{issue.ref} ({issue.state}){labels}: {issue.title}")
    print(f"opened by {issue.author} on {_when(issue.created)} · {issue.url}\n")
    print(issue.body or "(no description)")
    for comment in tracker.list_comments(ref.number):
        print(f"\n--- comment {comment.id} by {comment.author}, updated {_when(comment.updated)} ---")
        print(comment.body)
    return 0


def _list(args: argparse.Namespace) -> int:
    tracker = _reader(args.repo, args)
    issues = tracker.list_issues(args.state)
    if args.format == "json":
        print(json.dumps([_issue_json(i) for i in issues], indent=1))
        return 0
    if not issues:
        print(f"no {args.state if args.state != 'all' else ''} issues in {tracker.repo} ({tracker.kind} "
              "tracker)")
    for issue in issues:
        labels = f" [{', '.join(issue.labels)}]" if issue.labels else ""
        print(f"{issue.ref}\t{issue.state}\t{issue.title}{labels}")
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``marin issue``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return {"new": _new, "show": _show, "list": _list}[args.command](args)
    except NoExperimentsError:
        raise  # the one error every read command gives for a wrong --prefix (printed by marin/cli.py)
    except (TrackerError, ValueError, OSError) as exc:
        print(f"marin issue {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
