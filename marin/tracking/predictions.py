"""Pre-registered predictions: post frozen records to the issue, track a run against them, list them all.

The engine knows no ML. It reads three JSON files that steps write in a documented format
(docs/scaling-ladder.md, "Records"), generically:

- ``prediction.json`` (schema ``marin-prediction/v1``): ``points`` (each ``label``, ``step``, ``point``,
  ``low``, ``high``), ``metric`` (``name``, ``path``), ``target`` (``name``, ``config_hash``), ``issue``,
  and ``record_sha256``, the sha256 of the record's canonical JSON without that key (sorted keys, compact
  separators, UTF-8, no NaN);
- ``tracking.json`` (``marin-tracking/v1``), written by a step that is scored against a prediction: the
  record's path and hash, and which rows of its ``metrics.jsonl`` carry the metric (``metric_path``, e.g.
  ``eval.micro.bpb`` on rows with a ``step``);
- ``verdict.json`` (``marin-verdict/v1``): ``prediction_sha256``, ``points`` (``actual``, ``error_pct``,
  ``inside``), ``hits``/``n``, sealed like the prediction;
- ``note.json`` (``marin-prediction-note/v1``): something a step found out about a prediction after it was
  frozen (e.g. whether the target's learning rate was the best one: operators/scaling/lrcheck.py):
  ``prediction_sha256``, ``title``, ``text``, sealed like the prediction.

What it does with them:

- :class:`PredictionPublisher` (registered for every run linked to an issue) posts each new prediction as
  its *own* comment the moment its step succeeds — a comment it never edits, whose first line is a marker
  with the record's hash and whose text quotes the hash — then writes ``posted.json`` next to the record
  (hash, comment id, URL, creation time). The target step waits for that receipt, so the forecast is on the
  issue before the target's first training step on any backend. A verdict, and a note, is posted the same
  way, quoting the prediction's hash. All are idempotent: a restarted run finds the comment by its marker.
- :func:`tracking_section` adds "on track / off track by x% (outside the 90% interval)" lines to the status
  comment for every running or finished step that writes ``tracking.json``.
- :func:`list_predictions` walks a prefix for every record, checks its hash, pairs it with its verdict and
  computes the interval hit rate (``marin predictions`` and the dashboard's calibration page).
Why the file is past 400 lines: the three records (prediction, tracking, verdict) are one protocol; their
reading, posting, tracking and listing share the hashing and the format, so they live together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import fsspec

from marin.status.publisher import RunView, StepView
from marin.tracking.base import Tracker

logger = logging.getLogger(__name__)
HASH_KEY = "record_sha256"
PREDICTION_FILE, POSTED_FILE, TRACKING_FILE, VERDICT_FILE, NOTE_FILE = (
    "prediction.json",
    "posted.json",
    "tracking.json",
    "verdict.json",
    "note.json",
)
PREDICTION_MARKER = "<!-- marin-prediction:{sha} -->"
VERDICT_MARKER = "<!-- marin-verdict:{sha} -->"
NOTE_MARKER = "<!-- marin-note:{sha} -->"


def record_hash(record: dict[str, Any]) -> str:
    """sha256 of the record's canonical JSON without ``record_sha256``."""
    body = {k: v for k, v in record.items() if k != HASH_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verified(record: Any) -> bool:
    """Whether ``record`` is sealed and its content matches its hash (an edited file does not)."""
    return isinstance(record, dict) and record.get(HASH_KEY) == record_hash(record)


def read_json(path: str) -> Any:
    """The JSON at ``path``, or None when the file does not exist (or is being written)."""
    fs, p = fsspec.core.url_to_fs(path)
    try:
        with fs.open(p, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None


def write_json(path: str, obj: Any) -> None:
    fs, p = fsspec.core.url_to_fs(path)
    tmp = f"{p}.tmp-{time.time_ns()}"
    with fs.open(tmp, "w") as handle:
        json.dump(obj, handle, indent=1, sort_keys=True)
    fs.mv(tmp, p)


# ---- tracking a running step against its prediction ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrackPoint:
    """One evaluation point of a tracked step: the band and, once it landed, the actual value."""

    label: str
    step: int
    point: float
    low: float
    high: float
    actual: float | None

    @property
    def state(self) -> str:
        """``pending``, ``on track`` or ``off track``."""
        if self.actual is None:
            return "pending"
        return "on track" if self.low <= self.actual <= self.high else "off track"

    @property
    def error_pct(self) -> float | None:
        """(predicted - actual) / actual in %, the record's scoring convention."""
        return None if self.actual is None else 100.0 * (self.point - self.actual) / self.actual

    def describe(self) -> str:
        if self.actual is None:
            return f"pending (predicted {self.point:.4f} [{self.low:.4f}, {self.high:.4f}])"
        off = 100.0 * (self.actual - self.point) / self.point
        where = "inside" if self.state == "on track" else "outside"
        head = "on track" if self.state == "on track" else f"off track by {off:+.2f}%"
        return (
            f"{head} ({where} the 90% interval): actual {self.actual:.4f}, predicted {self.point:.4f} "
            f"[{self.low:.4f}, {self.high:.4f}]"
        )


def _dig(row: Any, path: str) -> float | None:
    node = row
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) and math.isfinite(node) else None


def metric_rows(metrics_path: str, metric_path: str) -> dict[int, float]:
    """step -> metric value of the rows of a metrics.jsonl that carry ``metric_path``."""
    fs, p = fsspec.core.url_to_fs(metrics_path)
    out: dict[int, float] = {}
    try:
        with fs.open(p, "r") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line may be half-written
                value = _dig(row, metric_path) if isinstance(row, dict) else None
                if value is not None and isinstance(row.get("step"), int):
                    out[row["step"]] = value
    except FileNotFoundError:
        pass
    return out


def track(output_path: str) -> tuple[dict[str, Any], list[TrackPoint]] | None:
    """(prediction record, points) for a step that writes tracking.json; None for other steps."""
    tracking = read_json(f"{output_path.rstrip('/')}/{TRACKING_FILE}")
    if not isinstance(tracking, dict) or "prediction" not in tracking:
        return None
    record = read_json(str(tracking["prediction"]))
    if not verified(record) or record.get(HASH_KEY) != tracking.get(HASH_KEY):
        return None
    values = metric_rows(
        f"{output_path.rstrip('/')}/{tracking.get('metrics_file', 'metrics.jsonl')}",
        str(tracking.get("metric_path") or record["metric"]["path"]),
    )
    return record, track_points(record, values)


def track_points(record: dict[str, Any], actual: dict[int, float]) -> list[TrackPoint]:
    """The record's eval points with the actual value at each step, where one exists."""
    return [
        TrackPoint(
            label=str(p["label"]),
            step=int(p["step"]),
            point=float(p["point"]),
            low=float(p["low"]),
            high=float(p["high"]),
            actual=actual.get(int(p["step"])),
        )
        for p in record["points"]
    ]


def tracking_section(steps: Sequence[StepView]) -> list[str]:
    """Status-comment lines for every running or finished step tracked against a prediction."""
    lines: list[str] = []
    for step in steps:
        if step.status not in ("RUNNING", "SUCCESS"):
            continue
        found = track(step.output_path)
        if found is None:
            continue
        record, points = found
        landed = [p for p in points if p.actual is not None]
        latest = landed[-1] if landed else points[0]
        lines += [
            "",
            f"#### Prediction `{record[HASH_KEY][:12]}` for `{step.name}` ({record['metric']['name']}): "
            f"{latest.describe() if landed else 'no evaluation yet'}",
            "",
            "| Point | Step | Predicted | 90% interval | Actual | State |",
            "|---|---|---|---|---|---|",
        ]
        for p in points:
            actual = f"{p.actual:.4f}" if p.actual is not None else "—"
            state = (
                p.state
                if p.actual is None or p.state == "on track"
                else f"off track by {100.0 * (p.actual - p.point) / p.point:+.2f}%"
            )
            lines.append(
                f"| {p.label} | {p.step} | {p.point:.4f} | [{p.low:.4f}, {p.high:.4f}] | {actual} | {state} |"
            )
    return lines


# ---- posting records -------------------------------------------------------------------------------------


def _gates_line(record: dict[str, Any]) -> str:
    """What the ladder's own checks flagged before the target ran (operators.scaling.forecast)."""
    if "warnings" not in record:
        return "Gates: not recorded (an older record)"
    return "Gates (recorded, not enforced): " + ("; ".join(record["warnings"]) or "none flagged")


def _law_line(record: dict[str, Any]) -> str:
    """The fitted form, and whether E was fitted or fixed (a fixed E is an assumption the reader must see)."""
    form = record.get("form", {})
    fixed = record.get("fitter", {}).get("fixed_e")
    e_text = "E fitted" if fixed is None else f"E fixed at {fixed:g} (an assumption, not fitted)"
    line = f"Law: `{form.get('formula', '?')}` in {form.get('x', '?')}; {e_text}"
    rule = record.get("end_rule")
    if rule:
        law = record["points"][-1].get("end_law") or {}
        line += (
            f". Endpoint rule `{rule['id']}`: the law at the target's {rule['anchor']} minus the rungs' mean "
            f"fall from {rule['anchor']} to the end, {rule['fall_mean']:.4f} (sd of one run's fall "
            f"{rule['fall_sd']:.4f}, {rule['runs']} runs)"
            + (f"; the end law alone says {law['point']:.4f}" if "point" in law else "")
        )
    return line


def prediction_body(record: dict[str, Any]) -> str:
    """The never-edited comment of a prediction: marker, table, hash, the record in full."""
    sha = record[HASH_KEY]
    rows = [
        f"| {p['label']} | {p['step']} | {p['point']:.4f} | [{p['low']:.4f}, {p['high']:.4f}] |"
        for p in record["points"]
    ]
    target = record.get("target", {})
    return "\n".join(
        [
            PREDICTION_MARKER.format(sha=sha),
            f"### 🔒 Pre-registered prediction for `{target.get('name', '?')}` ({record['metric']['name']})",
            "",
            f"Frozen before the target's first step. Record sha256 `{sha}`; target config hash "
            f"`{target.get('config_hash', '?')}`. This comment is never edited.",
            "",
            "| Point | Step | Predicted | 90% interval |",
            "|---|---|---|---|",
            *rows,
            "",
            _law_line(record),
            "",
            "Assumptions: " + ("; ".join(record.get("assumptions") or []) or "none stated"),
            "",
            _gates_line(record),
            "",
            "<details><summary>The record (prediction.json)</summary>",
            "",
            "```json",
            json.dumps(record, indent=1, sort_keys=True)[:40_000],
            "```",
            "</details>",
        ]
    )


def verdict_body(verdict: dict[str, Any]) -> str:
    """The comment of a verdict, quoting the prediction's hash."""
    rows = [
        f"| {p['label']} | {p['step']} | {p['point']:.4f} | [{p['low']:.4f}, {p['high']:.4f}] | "
        f"{p['actual']:.4f} | {p['error_pct']:+.2f}% | {'✅ inside' if p['inside'] else '❌ outside'} |"
        for p in verdict["points"]
    ]
    end = verdict["points"][-1]
    return "\n".join(
        [
            VERDICT_MARKER.format(sha=verdict[HASH_KEY]),
            f"### Verdict on prediction `{verdict['prediction_sha256']}` ({verdict['metric']})",
            "",
            f"Endpoint: predicted {end['point']:.4f}, actual {end['actual']:.4f}, "
            f"error {end['error_pct']:+.2f}% ({'inside' if end['inside'] else 'outside'} the 90% interval); "
            f"{verdict['hits']}/{verdict['n']} points "
            f"inside. Verdict sha256 `{verdict[HASH_KEY]}`."
            + (
                f" The end law alone (not the registered endpoint) said {end['end_law']['point']:.4f}, "
                f"{end['end_law']['error_pct']:+.2f}%."
                if "end_law" in end
                else ""
            ),
            "",
            "| Point | Step | Predicted | 90% interval | Actual | Error | |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def note_body(note: dict[str, Any]) -> str:
    """The comment of a note on a prediction, quoting the prediction's hash."""
    return "\n".join(
        [
            NOTE_MARKER.format(sha=note[HASH_KEY]),
            f"### {note['title']} (prediction `{note['prediction_sha256']}`)",
            "",
            str(note["text"]),
            "",
            f"Note sha256 `{note[HASH_KEY]}`.",
        ]
    )


def _find(tracker: Tracker, number: int, marker: str) -> Any | None:
    for comment in tracker.list_comments(number):
        if comment.body.startswith(marker):
            return comment
    return None


def post_record(tracker: Tracker, number: int, marker: str, body: str) -> Any:
    """The comment starting with ``marker``, created with ``body`` if there is none (never edited)."""
    found = _find(tracker, number, marker)
    return found if found is not None else tracker.create_comment(number, body)


class PredictionPublisher:
    """Posts predictions and verdicts of a run's steps to issue ``number`` (see the module docstring)."""

    name = "predictions"

    def __init__(self, tracker: Tracker, number: int) -> None:
        self.tracker, self.number = tracker, number
        self._done: set[str] = set()

    def publish(self, run: RunView, final: bool) -> None:
        for step in run.steps:
            if step.status != "SUCCESS" or step.output_path in self._done:
                continue
            self._handle(step.output_path)
            self._done.add(step.output_path)

    def _handle(self, output_path: str) -> None:
        root = output_path.rstrip("/")
        record = read_json(f"{root}/{PREDICTION_FILE}")
        if record is not None:
            self._post_prediction(root, record)
        kinds = ((VERDICT_FILE, VERDICT_MARKER, verdict_body), (NOTE_FILE, NOTE_MARKER, note_body))
        for name, marker, body in kinds:
            found = read_json(f"{root}/{name}")
            if found is not None and verified(found):
                post_record(self.tracker, self.number, marker.format(sha=found[HASH_KEY]), body(found))

    def _ensure_issue(self, record: dict[str, Any]) -> None:
        from marin.tracking.base import TrackerNotFound
        from marin.tracking.local import LocalTracker

        try:
            self.tracker.get_issue(self.number)
        except TrackerNotFound:
            if not isinstance(self.tracker, LocalTracker):
                raise
            # a fresh prefix has an empty local tracker: create the issue the run refers to
            self.tracker.ensure_issue(
                self.number,
                title=str(record.get("experiment") or "experiment"),
                body=f"Experiment `{record.get('experiment')}`.",
            )

    def _post_prediction(self, root: str, record: Any) -> None:
        if not verified(record):
            raise ValueError(
                f"{root}/{PREDICTION_FILE} does not match its record_sha256: it was edited after "
                "it was written, so it is not posted"
            )
        sha = record[HASH_KEY]
        posted = read_json(f"{root}/{POSTED_FILE}")
        if isinstance(posted, dict) and posted.get(HASH_KEY) == sha:
            return
        self._ensure_issue(record)
        comment = post_record(
            self.tracker, self.number, PREDICTION_MARKER.format(sha=sha), prediction_body(record)
        )
        write_json(
            f"{root}/{POSTED_FILE}",
            {
                HASH_KEY: sha,
                "issue": f"{self.tracker.repo}#{self.number}",
                "comment_id": comment.id,
                "comment_url": comment.url,
                "comment_created": comment.created,
                "posted_at": time.time(),
            },
        )


def prediction_publisher_factory(ctx: Any) -> PredictionPublisher | None:
    """The executor's hook: a publisher for runs linked to an issue (None when unlinked or switched off)."""
    from marin.tracking.factory import linked_issue, make_tracker

    ref = linked_issue(ctx)
    return None if ref is None else PredictionPublisher(make_tracker(ref.repo, ctx.prefix), ref.number)


# ---- the calibration view ------------------------------------------------------------------------------


def _records(prefix: str, filename: str) -> list[tuple[str, Any]]:
    fs, root = fsspec.core.url_to_fs(prefix)
    root = root.rstrip("/")
    found = []
    for path in sorted(fs.glob(f"{root}/**/{filename}")):
        if "/.marin/" in path or "/checkpoints/" in path:
            continue
        with fs.open(path, "rb") as handle:
            try:
                found.append(
                    (fs.unstrip_protocol(path) if "://" in prefix else path, json.loads(handle.read()))
                )
            except json.JSONDecodeError:
                found.append((path, None))
    return found


def list_predictions(prefix: str) -> dict[str, Any]:
    """Every prediction under ``prefix`` with its verdict, and the hit rate of the scored intervals."""
    verdicts = {
        v.get("prediction_sha256"): (path, v)
        for path, v in _records(prefix, VERDICT_FILE)
        if isinstance(v, dict)
    }
    rows = []
    for path, record in _records(prefix, PREDICTION_FILE):
        ok = verified(record)
        sha = record.get(HASH_KEY) if isinstance(record, dict) else None
        end = record["points"][-1] if ok else {}
        vpath, verdict = verdicts.get(sha, (None, None)) if ok else (None, None)  # a tampered copy has none
        posted = read_json(path.rsplit("/", 1)[0] + "/" + POSTED_FILE)
        row = {
            "path": path,
            "verified": ok,
            "sha256": sha,
            "experiment": record.get("experiment") if ok else None,
            "issue": record.get("issue") if ok else None,
            "target": (record.get("target") or {}).get("name") if ok else None,
            "metric": record["metric"]["name"] if ok else None,
            "point": end.get("point"),
            "low": end.get("low"),
            "high": end.get("high"),
            "posted": posted if isinstance(posted, dict) and posted.get(HASH_KEY) == sha else None,
            "verdict_path": vpath,
            "verdict_verified": verified(verdict) if verdict else None,
            "actual": None,
            "error_pct": None,
            "inside": None,
            "points_inside": None,
        }
        if verdict is not None and verified(verdict):
            vend = verdict["points"][-1]
            row.update(
                actual=vend["actual"],
                error_pct=vend["error_pct"],
                inside=vend["inside"],
                points_inside=f"{verdict['hits']}/{verdict['n']}",
            )
        rows.append(row)
    scored = [r for r in rows if r["inside"] is not None]
    return {
        "prefix": prefix,
        "predictions": rows,
        "scored": len(scored),
        "hit_rate": (sum(bool(r["inside"]) for r in scored) / len(scored)) if scored else None,
    }
