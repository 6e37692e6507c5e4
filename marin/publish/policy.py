"""The visibility policy: a small typed TOML file (`publish.toml`) parsed into frozen dataclasses.

Every table and key is known: an unknown one is an error that names it and lists the valid ones, so a typo
never silently publishes (or hides) anything. With no file the policy publishes nothing but says so: the
default `Policy()` selects no experiment until `[select] all = true` or a label, script, tag or id is given.

    [select]                  # an experiment is public when ANY rule matches
    all = false
    labels = ["marin:public"] # a label of the experiment's issue in the local tracker
    scripts = ["experiments/tutorial*.py"]   # fnmatch on the manifest's script
    tags = ["tutorial"]       # a tag of the experiment's frozen notebook
    experiments = ["exp12_*"] # fnmatch on the experiment id

    [raw]
    allow = []                # fnmatch globs of prefix-relative paths that may be linked raw (default none)
    logs = false              # publish step logs (redacted)

    [redact]
    names = ["alice"]         # more private names (users and hosts in records are found automatically)
    public_repos = ["marin-community/marin"]  # issue links to other repositories are private
    pseudonym_salt = ""       # salt of the stable pseudonyms (user-1a2b3c)

    [compare]
    baselines = true          # each experiment against its baseline
    pairs = [["exp_a", "exp_b"]]

    [site]
    title = "marin open lab"
"""

from __future__ import annotations

import dataclasses
import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PolicyError(ValueError):
    """publish.toml is malformed: the message names the key and the fix."""


@dataclass(frozen=True)
class Select:
    all: bool = False
    """Every experiment under the prefix is public."""
    labels: tuple[str, ...] = ()
    """Issue labels (local tracker) that make an experiment public, e.g. marin:public."""
    scripts: tuple[str, ...] = ()
    """fnmatch patterns on the manifest's script path."""
    tags: tuple[str, ...] = ()
    """Tags of the experiment's frozen notebook."""
    experiments: tuple[str, ...] = ()
    """fnmatch patterns on experiment ids."""


@dataclass(frozen=True)
class Raw:
    allow: tuple[str, ...] = ()
    """fnmatch globs of prefix-relative paths that may be linked raw; default none."""
    logs: bool = False
    """Publish step logs (after redaction)."""

    def allows(self, rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, g) for g in self.allow)


@dataclass(frozen=True)
class Redact:
    names: tuple[str, ...] = ()
    """More private names to replace (users and hosts named in records are found automatically)."""
    public_repos: tuple[str, ...] = ()
    """owner/repo whose issue links may be published; links to any other repository are private."""
    pseudonym_salt: str = ""
    """Salt of the stable pseudonyms, so a short name cannot be recovered by hashing guesses."""


@dataclass(frozen=True)
class Compare:
    baselines: bool = True
    """Pre-render each published experiment against its baseline (marin.compare's baseline_of)."""
    pairs: tuple[tuple[str, str], ...] = ()
    """More (baseline, other) experiment pairs to pre-render; both must be public."""


@dataclass(frozen=True)
class Site:
    title: str = "marin open lab"
    """The site's name, shown on the index."""


@dataclass(frozen=True)
class Policy:
    select: Select = field(default_factory=Select)
    raw: Raw = field(default_factory=Raw)
    redact: Redact = field(default_factory=Redact)
    compare: Compare = field(default_factory=Compare)
    site: Site = field(default_factory=Site)

    def selects(self, experiment_id: str, manifest: dict[str, Any],
                labels: tuple[str, ...] = ()) -> bool:
        """Whether the experiment is public under this policy."""
        s = self.select
        notebook = manifest.get("notebook") if isinstance(manifest.get("notebook"), dict) else {}
        tags = notebook.get("tags") or () if isinstance(notebook, dict) else ()
        script = str(manifest.get("script") or "")
        return (
            s.all
            or any(fnmatch.fnmatchcase(experiment_id, p) for p in s.experiments)
            or any(fnmatch.fnmatchcase(script, p) for p in s.scripts)
            or bool(set(s.tags) & {str(t) for t in tags if isinstance(t, str)})
            or bool(set(s.labels) & set(labels))
        )


_SECTIONS: dict[str, type] = {"select": Select, "raw": Raw, "redact": Redact, "compare": Compare,
                              "site": Site}


def _coerce(where: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise PolicyError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise PolicyError(f"{where}: expected a string, got {value!r}")
        return value
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a list, got {value!r}")
    if where.endswith(".pairs"):
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value):
            raise PolicyError(f"{where}: expected a list of [baseline, other] experiment id pairs")
        return tuple(tuple(p) for p in value)
    if not all(isinstance(x, str) for x in value):
        raise PolicyError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _section(name: str, table: Any) -> Any:
    cls = _SECTIONS[name]
    if not isinstance(table, dict):
        raise PolicyError(f"[{name}] must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    for key in table:
        if key not in fields:
            raise PolicyError(f"unknown key {name}.{key} in the publish policy; valid keys of [{name}]: "
                              f"{', '.join(fields)}")
    return cls(**{k: _coerce(f"{name}.{k}", v, getattr(defaults, k)) for k, v in table.items()})


def parse_policy(data: dict[str, Any]) -> Policy:
    """A Policy from parsed TOML; unknown tables or keys raise PolicyError naming them."""
    for key in data:
        if key not in _SECTIONS:
            raise PolicyError(f"unknown table [{key}] in the publish policy; valid tables: "
                              f"{', '.join(_SECTIONS)}")
    return Policy(**{k: _section(k, v) for k, v in data.items()})


def load_policy(path: str | Path | None) -> Policy:
    """The policy in `path` (None: the default, which publishes nothing)."""
    if path is None:
        return Policy()
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise PolicyError(f"no publish policy at {p}; write one (docs/publish.md) or omit --policy") from e
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{p} is not valid TOML: {e}") from e
    try:
        return parse_policy(data)
    except PolicyError as e:
        raise PolicyError(f"{p}: {e}") from e
