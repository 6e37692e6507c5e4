"""Issue references (`owner/repo#N`): parsing, and inference from an experiment script named
`exp<N>_<slug>.py`."""

from __future__ import annotations

import dataclasses
import os
import re

_REF = re.compile(r"^(?P<repo>[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+)#(?P<number>[1-9][0-9]*)$")
_SCRIPT = re.compile(r"^exp0*(?P<number>[1-9][0-9]*)_[A-Za-z0-9_]+\.py$")  # exp12_x.py, exp0012_x.py
REPO_ENV = "MARIN_ISSUE_REPO"


@dataclasses.dataclass(frozen=True)
class IssueRef:
    """A GitHub-style issue: repository `owner/name` and issue number."""

    repo: str
    number: int

    @classmethod
    def parse(cls, text: str) -> IssueRef:
        """Parse `owner/repo#N`; `#N` or `N` alone use the repository from MARIN_ISSUE_REPO."""
        text = text.strip()
        bare = re.fullmatch(r"#?([1-9][0-9]*)", text)
        if bare:
            repo = os.environ.get(REPO_ENV)
            if not repo:
                raise ValueError(f"issue {text!r} has no repository: write owner/repo#N or set "
                                 f"{REPO_ENV}=owner/repo")
            text = f"{repo}#{bare.group(1)}"
        match = _REF.match(text)
        if not match:
            raise ValueError(f"invalid issue reference {text!r}: expected owner/repo#N, e.g. "
                             "marin-community/marin#12")
        return cls(match.group("repo"), int(match.group("number")))

    @classmethod
    def from_script(cls, script: str | None, repo: str | None = None) -> IssueRef | None:
        """The issue of a script named `exp<N>_<slug>.py`, with `repo` or MARIN_ISSUE_REPO; else None."""
        if not script:
            return None
        match = _SCRIPT.match(os.path.basename(script))
        repo = repo or os.environ.get(REPO_ENV)
        if not match or not repo:
            return None
        return cls(repo, int(match.group("number")))

    def __str__(self) -> str:
        return f"{self.repo}#{self.number}"
