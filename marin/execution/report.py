"""What a run tells the person who started it, besides the plan: where to look (first), what it found (last).

- `banner`: the experiment id and prefix, the dashboard command and the page of this experiment, and the
  issue (printed after the plan, unless `-q`).
- `results`: every number the run's steps declare as their headline (`HEADLINE_METRICS` on a step's config
  class, read generically from the files they wrote: marin/status/results.py), one per line, then the verdict
  in plain words with its deciding numbers (marin/status/verdicts.py). The engine knows no tokens or models:
  a step that declares nothing is not listed.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable

from marin.status import files as sf
from marin.status import results, verdicts
from marin.status.publisher import RunContext
from marin.storage.base import Storage

DASHBOARD_URL = "http://127.0.0.1:8000"  # `marin dashboard`'s default address


def banner(run: RunContext) -> str:
    prefix = shlex.quote(run.prefix)
    url = (os.environ.get("MARIN_DASHBOARD_URL") or DASHBOARD_URL).rstrip("/")
    lines = [f"experiment {run.experiment_id} under {run.prefix}",
             f"  dashboard: marin dashboard --prefix {prefix}   then {url}/experiments/{run.experiment_id}"]
    if run.issue:
        lines.append(f"  issue:     {run.issue}   (marin issue show {run.issue} --prefix {prefix})")
    else:
        lines.append("  issue:     none linked (executor_main(issue='owner/repo#N'), --issue, or a script "
                     "named exp<N>_<slug>.py with MARIN_ISSUE_REPO)")
    return "\n".join(lines)


def results_text(storage: Storage, prefix: str, experiment_id: str,
                 steps: Iterable[tuple[str, str, str, object]]) -> str:
    """The results block for the run's `steps` (name, hash, output path, config), those that succeeded."""
    lines = ["results (each step's headline numbers, from the files it wrote):"]
    found: list[tuple[str, results.Number]] = []
    for name, h, path, config in steps:
        patterns = results.declared(config, "HEADLINE_METRICS")
        if not patterns or (sf.read_status(storage, path) or {}).get("status") != sf.SUCCESS:
            continue
        found += [(f"{name}-{h[:8]}", n) for n in results.read_headline(storage, path, patterns)]
    width = max((len(label) for label, _ in found), default=0)
    previous = None
    for label, number in found:
        lines.append(f"  {label if label != previous else '':<{width}}  {number.file}  {number.text()}")
        previous = label
    if len(lines) == 1:
        lines.append("  (no step of this run declares headline numbers)")
    doc = verdicts.read_verdicts(storage, prefix, experiment_id)
    current = (doc or {}).get("current")
    lines.append(f"verdict: {verdicts.plain_words(current)}" if current else
                 "verdict: none (the experiment declares no hypothesis and criterion; docs/notebook.md)")
    return "\n".join(lines)
