"""Verdicts: whether an experiment's idea worked, decided from its frozen criterion or by a person.

The file `{prefix}/experiments/{experiment id}/verdicts.json` (docs/formats.md) holds the current verdict and
its append-only history:

    {"schema": "marin-verdicts/v1", "experiment": "exp2_...-0a1b2c3d", "current": {...entry...},
     "history": [{...entry...}, ...]}

An entry: `outcome` (one of `OUTCOMES`), `note`, `by` (`marin` or the person), `source` (`computed` or
`person`), `at`, `run_id`, `notebook_sha256`, `criteria` (per criterion: `metric`, `better`, `baseline`
(its label), `min_effect`, `value`, `baseline_value`, `effect`, `met`, `reason`) and `infra` (the
infrastructure trouble found, one line each).

**Computed** at the end of every run of an experiment that declares a criterion (`judge`):

- per criterion: the metric is read from its step's output when that step is SUCCESS (`read_metric`), the
  baseline likewise (a step or metric of the same experiment, a fixed value, or another experiment's recorded
  value of the same path); `effect` is the improvement in the `better` direction, `met` is
  `effect >= min_effect` (a non-finite value is not met; a non-finite baseline cannot be judged);
- a number that cannot be read is traced to the first step on its path that is not SUCCESS: PREEMPTED (its
  preemption budget exhausted, a node lost: the interruption ledger says which) or a run that ended
  DRIVER_LOST is **infrastructure trouble**; a FAILED step or a missing key is not;
- combined: every criterion met -> `worked`, none -> `did_not_work`, some -> `mixed`; some criteria could not
  be judged -> `inconclusive`; none could -> `infra_failure` when infrastructure trouble explains it (never
  `did_not_work`), else `not_evaluated`.

**Set by a person** (`marin verdict`): a person's entry becomes current and stays so (later computed entries
are appended to the history, but do not replace it) until a person sets another. A computed entry equal to
the last computed one (same outcome and numbers) is not appended again. Updates are compare-and-swap like
the manifest's, so two writers never lose an entry.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from marin.definition.criterion import OUTCOMES
from marin.definition.placeholders import join
from marin.errors import CorruptFileError
from marin.status import damaged
from marin.status import files as sf
from marin.status.interruptions import read_ledger
from marin.status.manifest import EXPERIMENTS_DIR, manifest_path, update_json
from marin.storage.base import Storage

SCHEMA = "marin-verdicts/v1"
COMPUTED, PERSON = "computed", "person"
TAIL_BYTES = 256 * 1024
DEFAULT_FILES = ("eval.json", "metrics.jsonl")
EPSILON = 1e-12  # floating-point noise: 1.30 - 1.25 must meet min_effect=0.05 whichever way it rounds


def verdicts_path(prefix: str, experiment_id: str) -> str:
    return join(prefix, f"{EXPERIMENTS_DIR}/{experiment_id}/verdicts.json")


def read_verdicts(storage: Storage, prefix: str, experiment_id: str) -> dict[str, Any] | None:
    return sf.read_record(storage, verdicts_path(prefix, experiment_id))


# ---- reading a number ----------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if value in ("nan", "inf", "-inf"):  # how metrics.jsonl writes non-finite values
        return float(value)
    return None


def dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def last_row(output_path: str, name: str, keep: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The last JSON object `keep` accepts among the last `TAIL_BYTES` of the JSONL file `name` under
    `output_path` (a torn last line, or the tail's first line cut mid-record, is passed over); None when the
    file does not exist or holds none."""
    fs, root = fsspec.core.url_to_fs(output_path)
    path = f"{root.rstrip('/')}/{name}"
    try:
        size = fs.size(path)
        with fs.open(path, "rb") as handle:
            handle.seek(max(0, size - TAIL_BYTES))
            lines = handle.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and keep(row):
            return row
    return None


def _from_file(storage: Storage, output_path: str, name: str, key: str) -> float | None:
    if name.endswith(".jsonl"):
        want_eval = key.split(".", 1)[0] in ("eval", "eval_capacity")
        row = last_row(output_path, name, lambda r: ("eval" in r) == want_eval)
        return _number(dig(row, key)) if row else None
    return _number(dig(sf.read_record(storage, join(output_path, name)), key))


def read_metric(storage: Storage, output_path: str, path: str) -> float | None:
    """The number at `path` in a step's output: `FILE.json[l]/dotted.key`, or a dotted key looked up in
    `eval.json` then the last row of `metrics.jsonl` (`a_b` also tries `a.b`: `macro_bpb` is `macro.bpb`)."""
    head, _, rest = path.partition("/")
    if rest and head.endswith((".json", ".jsonl")):
        return _from_file(storage, output_path, head, rest)
    keys = [path] + ([path.replace("_", ".", 1)] if "_" in path and "." not in path else [])
    for key in keys:
        for name in DEFAULT_FILES:
            value = _from_file(storage, output_path, name, key)
            if value is not None:
                return value
    return None


# ---- judging one criterion -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """One criterion, judged: the numbers, or why they are missing (and whether infrastructure is why)."""

    metric: str
    better: str
    baseline: str
    min_effect: float
    value: float | None = None
    baseline_value: float | None = None
    effect: float | None = None
    met: bool | None = None
    reason: str = ""
    infra: bool = False


class _Experiment:
    """One experiment's manifest and step states, read once per judgement."""

    def __init__(self, storage: Storage, prefix: str, manifest: dict[str, Any]) -> None:
        self.storage, self.prefix, self.manifest = storage, prefix, manifest
        self.steps = {s["hash"]: s for s in manifest.get("steps") or []
                      if isinstance(s, dict) and "hash" in s}
        runs = [r for r in manifest.get("runs") or [] if isinstance(r, dict)]
        self.driver_lost = bool(runs) and runs[-1].get("status") == "DRIVER_LOST"
        self._status: dict[str, dict[str, Any]] = {}

    def status(self, h: str) -> dict[str, Any]:
        if h not in self._status:
            entry = self.steps.get(h) or {}
            path = entry.get("output_path")
            self._status[h] = (sf.read_status(self.storage, path) or {}) if path else {}
        return self._status[h]

    def blocker(self, h: str) -> tuple[str, bool]:
        """Why step `h`'s number is missing: the first step on its path that is not SUCCESS (dependencies
        first), and whether that is infrastructure trouble."""
        order, seen, stack = [], set(), [h]
        while stack:  # iterative walk: dependencies before their users
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            order.append(cur)
            stack.extend((self.steps.get(cur) or {}).get("dependencies") or [])
        for cur in reversed(order):
            found = self._trouble(cur)
            if found:
                return found
        return "", False

    def _trouble(self, h: str) -> tuple[str, bool] | None:
        st = self.status(h)
        name = (self.steps.get(h) or {}).get("name", h[:8])
        state = st.get("status")
        if state == sf.SUCCESS:
            return None
        message = str((st.get("error") or {}).get("message") or "")[:200]
        if state == sf.PREEMPTED:
            ledger = read_ledger(self.storage, self.steps[h]["output_path"])
            causes = ledger.get("totals", {}).get("by_cause", {})
            lost = ", ".join(f"{n} {c}" for c, n in sorted(causes.items())) or "interrupted"
            return f"step {name} ended PREEMPTED ({lost}){': ' + message if message else ''}", True
        if self.driver_lost:
            return f"step {name} is {state or 'not run'}: the run's driver was lost", True
        if state == sf.FAILED:
            return f"step {name} FAILED: {message}", False
        if state is None:
            return f"step {name} has not run", False
        return (f"step {name} is {state}", False) if state != sf.DEP_FAILED else None

    def number(self, h: str, path: str) -> tuple[float | None, str, bool]:
        entry = self.steps.get(h)
        if entry is None:
            return None, f"step {h[:8]} is not in the manifest", False
        if self.status(h).get("status") != sf.SUCCESS:
            reason, infra = self.blocker(h)
            return None, reason or f"step {entry.get('name')} did not succeed", infra
        value = read_metric(self.storage, entry["output_path"], path)
        if value is None:
            return None, f"{entry.get('name')}:{path} was not found in its outputs", False
        return value, "", False


def _other_experiment_value(storage: Storage, prefix: str, experiment_id: str, path: str) -> tuple[
        float | None, str]:
    manifest = sf.read_record(storage, manifest_path(prefix, experiment_id))
    if manifest is None:
        return None, f"no experiment {experiment_id} under the prefix"
    doc = read_verdicts(storage, prefix, experiment_id) or {}
    for entry in reversed(doc.get("history") or []):
        for c in entry.get("criteria") or []:
            if str(c.get("metric", "")).split(":", 1)[-1] == path and _number(c.get("value")) is not None:
                return _number(c.get("value")), ""
    other = _Experiment(storage, prefix, manifest)
    for c in (manifest.get("notebook") or {}).get("criteria") or []:
        value, _, _ = other.number(str(c.get("hash")), path)
        if value is not None:
            return value, ""
    return None, f"experiment {experiment_id} has no recorded value of {path}"


def judge_criterion(exp: _Experiment, c: dict[str, Any]) -> Judged:
    b = c.get("baseline") or {}
    base = Judged(metric=str(c.get("metric")), better=str(c.get("better")), baseline=str(b.get("label")),
                  min_effect=float(c.get("min_effect") or 0.0))
    value, reason, infra = exp.number(str(c.get("hash")), str(c.get("path")))
    if value is None:
        return _replace(base, reason=reason, infra=infra)
    if b.get("kind") == "value":
        ref, why, infra = _number(b.get("value")), "", False
    elif b.get("kind") == "experiment":
        (ref, why), infra = _other_experiment_value(exp.storage, exp.prefix, str(b.get("experiment")),
                                                    str(b.get("path"))), False
    else:
        ref, why, infra = exp.number(str(b.get("hash")), str(b.get("path")))
    if ref is None:
        return _replace(base, value=value, reason=f"baseline: {why}", infra=infra)
    if not math.isfinite(ref):
        return _replace(base, value=value, baseline_value=ref, reason="the baseline is not finite")
    effect = (ref - value) if base.better == "lower" else (value - ref)
    met = math.isfinite(effect) and effect >= base.min_effect - EPSILON
    return _replace(base, value=value, baseline_value=ref, effect=effect if math.isfinite(effect) else None,
                    met=met, reason="" if math.isfinite(value) else "the value is not finite (diverged)")


def _replace(j: Judged, **changes: Any) -> Judged:
    return Judged(**{**asdict(j), **changes})


def combine(judged: list[Judged], declared: bool) -> tuple[str, str]:
    """The outcome and its note from the judged criteria (see the module docstring)."""
    if not declared or not judged:
        return "not_evaluated", "no criterion declared"
    done = [j for j in judged if j.met is not None]
    missing = [j for j in judged if j.met is None]
    reasons = "; ".join(j.reason for j in missing)
    if not done:
        infra = any(j.infra for j in missing)
        return ("infra_failure" if infra else "not_evaluated"), reasons
    if missing:
        return "inconclusive", f"{len(missing)} of {len(judged)} criteria could not be judged: {reasons}"
    met = sum(bool(j.met) for j in done)
    outcome = "worked" if met == len(done) else "did_not_work" if met == 0 else "mixed"
    return outcome, f"{met} of {len(done)} criteria met"


def judge(storage: Storage, prefix: str, manifest: dict[str, Any], *, run_id: str | None = None,
          now: float | None = None) -> dict[str, Any]:
    """The computed verdict entry of the experiment whose manifest is `manifest`."""
    notebook = manifest.get("notebook") or {}
    exp = _Experiment(storage, prefix, manifest)
    judged = [judge_criterion(exp, c) for c in notebook.get("criteria") or [] if isinstance(c, dict)]
    outcome, note = combine(judged, bool(notebook.get("criteria")))
    return {"outcome": outcome, "note": note, "by": "marin", "source": COMPUTED,
            "at": time.time() if now is None else now, "run_id": run_id,
            "notebook_sha256": notebook.get("sha256"),
            "criteria": [asdict(j) for j in judged],
            "infra": [j.reason for j in judged if j.infra]}


# ---- recording ------------------------------------------------------------------------------------------


def _repeats(doc: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether computed `entry` says what the last computed entry of `doc` said (outcome, note, numbers)."""
    last = next((e for e in reversed(doc.get("history") or []) if e.get("source") == COMPUTED), None)
    keys = ("outcome", "note", "criteria", "notebook_sha256")
    return last is not None and all(last.get(k) == entry.get(k) for k in keys)


def record(storage: Storage, prefix: str, experiment_id: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Append `entry` to the experiment's verdict history (see the module docstring for which entry is
    current); returns the file's new content."""
    if entry.get("outcome") not in OUTCOMES:
        raise ValueError(f"verdict outcome {entry.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
    existing = read_verdicts(storage, prefix, experiment_id)
    if existing is not None and entry["source"] == COMPUTED and _repeats(existing, entry):
        return existing  # a re-run that changed nothing writes nothing
    out: dict[str, Any] = {}

    def change(data: dict[str, Any] | None) -> dict[str, Any]:
        data = data or {"schema": SCHEMA, "experiment": experiment_id, "current": None, "history": []}
        history = data.setdefault("history", [])
        if entry["source"] == COMPUTED and _repeats(data, entry):
            out.update(data)
            return data
        history.append(entry)
        current = data.get("current")
        if entry["source"] == PERSON or not (isinstance(current, dict) and current.get("source") == PERSON):
            data["current"] = entry
        out.update(data)
        return data

    update_json(storage, verdicts_path(prefix, experiment_id), change)
    return out


def deciding(entry: dict[str, Any] | None, history: Iterable[dict[str, Any]] = ()) -> str:
    """The deciding number as one line: `macro.bpb 1.2340 vs 1.2500 (effect +0.0160, needed >= 0.01)`;
    a person's entry without numbers shows the last computed ones."""
    if not entry:
        return ""
    criteria: list[dict[str, Any]] = entry.get("criteria") or next(
        (e.get("criteria") for e in reversed(list(history)) if e.get("criteria")), [])
    parts = []
    for c in criteria:
        if c.get("value") is None:
            parts.append(f"{c.get('metric')}: {c.get('reason') or 'missing'}")
            continue
        base = "—" if c.get("baseline_value") is None else f"{c['baseline_value']:.4g}"
        effect = "" if c.get("effect") is None else f"effect {c['effect']:+.4g}, "
        parts.append(f"{c.get('metric')} {c['value']:.4g} vs {base} ({c.get('baseline')}; {effect}"
                     f"needed >= {c.get('min_effect', 0):g})")
    return "; ".join(parts)


def headline(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The experiment's headline number: the first criterion of `entry` that has a value (`metric`, `value`,
    `baseline_value`, `effect`, `met`), or None."""
    for c in (entry or {}).get("criteria") or []:
        if isinstance(c, dict) and _number(c.get("value")) is not None:
            return {k: c.get(k) for k in ("metric", "value", "baseline", "baseline_value", "effect", "met")}
    return None


def last_computed(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The newest computed entry of a verdicts document, or None."""
    return next((e for e in reversed((doc or {}).get("history") or []) if e.get("source") == COMPUTED), None)


def judged(doc: dict[str, Any] | None) -> bool:
    """Whether a verdict was recorded: a person set one, or a computed entry judged at least one criterion
    (a `not_evaluated` from a metric that could not be read does not count). Until then a criterion may be
    amended (docs/notebook.md, "Amending a criterion")."""
    for e in (doc or {}).get("history") or []:
        if e.get("source") == PERSON or any(c.get("met") is not None for c in e.get("criteria") or []):
            return True
    return False


def amendable(storage: Storage, prefix: str, experiment_id: str) -> bool:
    """Whether the experiment's criterion may still be amended: no verdict recorded (`judged`). A verdicts
    file that cannot be read counts as judged (said on stderr): a damaged record never unfreezes a
    hypothesis (status/damaged.py)."""
    try:
        doc = damaged.read_checked(storage, verdicts_path(prefix, experiment_id))
    except CorruptFileError as e:
        print(f"marin: warning: {e}\nmarin: the criterion is treated as judged (not amendable) until it is "
              "restored", file=sys.stderr, flush=True)
        return False
    return not judged(doc)


def plain_words(entry: dict[str, Any] | None) -> str:
    """The verdict as a sentence: `worked: eval/x:macro.bpb 1.234 vs 1.250 (...): 1 of 1 criteria met`."""
    if not entry:
        return "no verdict (the experiment declares no criterion)"
    outcome = str(entry.get("outcome"))
    meaning = {"worked": "the hypothesis held", "did_not_work": "the hypothesis did not hold",
               "mixed": "some criteria were met, some not",
               "inconclusive": "some criteria could not be judged",
               "not_evaluated": "nothing could be judged",
               "infra_failure": "infrastructure trouble stopped it"}
    text = f"{outcome} ({meaning.get(outcome, outcome)}; {entry.get('note') or ''})".replace("; )", ")")
    number = deciding(entry)
    return f"{text}: {number}" if number else text
