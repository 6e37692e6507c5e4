"""Pre-registered predictions on the issue: post each frozen record once, track a run against it, list them.

The engine knows no ML. It reads the records of :mod:`openlab_records` (docs/scaling-ladder.md, "Records")
through their typed readers and uses only their generic fields: a prediction's points (label, step, point,
90% interval), metric, target, issue, assumptions, the ``warnings`` its step's gates flagged and the
``summary`` lines its step rendered (the engine posts them as they are); a verdict's scored points; a
tracking file's prediction and metric path; a note's title and text. Errors are signed one way everywhere:
``(predicted - actual) / actual`` (:func:`openlab_records.error_pct`), so the verdict, this status comment,
the dashboard, the alert and the listing agree in sign and value.

- :class:`PredictionPublisher` (registered for every run linked to an issue, by
  :func:`marin.tracking.factory.prediction_publisher_factory`) posts each new prediction as its *own*
  comment the moment its step succeeds — a comment it never edits, whose first line is a marker with the
  record's hash and whose text quotes the hash — then writes ``posted.json`` next to the record (hash,
  comment id, URL, creation time). The target step waits for that receipt, so the forecast is on the issue
  before the target's first training step on any backend. A verdict, and a note, is posted the same way,
  quoting the prediction's hash. All are idempotent: a restarted run finds the comment by its marker.
- :func:`tracking_section` adds "on track / off track by x% (outside the 90% interval)" lines to the status
  comment for every running or finished step that writes ``tracking.json``.
- :func:`list_predictions` walks a prefix for every record, checks its hash, pairs it with its verdict and
  computes the interval hit rate (``marin predictions`` and the dashboard's calibration page).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from marin.status.publisher import RunView, StepView
from marin.tracking.base import Comment, Tracker
from openlab_records import (
    HASH_KEY,
    NOTE_FILE,
    POSTED_FILE,
    PREDICTION_FILE,
    TRACKING_FILE,
    VERDICT_FILE,
    Band,
    Note,
    Posted,
    Prediction,
    RecordFormatError,
    Tracking,
    Verdict,
    error_pct,
    error_words,
    is_sealed,
    read_json,
    write_json_atomic,
)

PREDICTION_MARKER = "<!-- marin-prediction:{sha} -->"
VERDICT_MARKER = "<!-- marin-verdict:{sha} -->"
NOTE_MARKER = "<!-- marin-note:{sha} -->"


def read_record(path: str) -> Any:
    """The JSON at ``path`` for a reader that polls: None when it is missing or not JSON yet."""
    try:
        return read_json(path)
    except RecordFormatError:
        return None


def read_posted(folder: str) -> Posted | None:
    """The receipt ``posted.json`` in a prediction's folder: None while there is none (or it is not JSON yet);
    a receipt without a field it needs is refused, naming the field (:class:`RecordFormatError`)."""
    path = f"{folder}/{POSTED_FILE}"
    raw = read_record(path)
    return None if raw is None else Posted.from_json(raw, path)


def sealed_as(kind: type[Prediction] | type[Verdict] | type[Note], raw: Any, where: str) -> Any:
    """``raw`` as a typed record when it is sealed and well-formed; None otherwise."""
    if not is_sealed(raw):
        return None
    try:
        return kind.from_json(raw, where)
    except RecordFormatError:
        return None


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
        """``(predicted - actual) / actual`` in %, the one sign convention (positive: forecast too high)."""
        return None if self.actual is None else error_pct(self.point, self.actual)

    @property
    def state_text(self) -> str:
        """The state, with the signed error when off track (``off track by -6.25%``)."""
        return f"off track by {self.error_pct:+.2f}%" if self.state == "off track" else self.state

    def describe(self, metric: str = "metric") -> str:
        """The point in one line: state, signed error, the error in words (:func:`error_words`)."""
        if self.actual is None:
            return f"pending (predicted {self.point:.4f} [{self.low:.4f}, {self.high:.4f}])"
        where = "inside" if self.state == "on track" else "outside"
        error = error_pct(self.point, self.actual)
        return (
            f"{self.state_text} ({where} the 90% interval): actual {self.actual:.4f}, predicted "
            f"{self.point:.4f} [{self.low:.4f}, {self.high:.4f}], {error:+.2f}%: {error_words(error, metric)}"
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


def track_points(points: Sequence[Band], actual: dict[int, float]) -> list[TrackPoint]:
    """The bands with the actual value at each step, where one exists."""
    return [TrackPoint(p.label, p.step, p.point, p.low, p.high, actual.get(p.step)) for p in points]


def track(output_path: str) -> tuple[Prediction, list[TrackPoint]] | None:
    """(prediction, points) for a step that writes tracking.json; None for other steps."""
    raw = read_record(f"{output_path.rstrip('/')}/{TRACKING_FILE}")
    try:
        tracking = Tracking.from_json(raw) if isinstance(raw, dict) else None
    except RecordFormatError:
        return None
    if tracking is None:
        return None
    record = sealed_as(Prediction, read_record(tracking.prediction), tracking.prediction)
    if record is None or record.sha256 != tracking.prediction_sha256:
        return None
    values = metric_rows(f"{output_path.rstrip('/')}/{tracking.metrics_file}", tracking.metric_path)
    return record, track_points(record.points, values)


def _tracked_step_lines(name: str, record: Prediction, points: list[TrackPoint]) -> list[str]:
    landed = [p for p in points if p.actual is not None]
    lines = [
        "",
        f"#### Prediction `{str(record.sha256)[:12]}` for `{name}` ({record.metric}): "
        f"{landed[-1].describe(record.metric) if landed else 'no evaluation yet'}",
        "",
        "| Point | Step | Predicted | 90% interval | Actual | State |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        actual = f"{p.actual:.4f}" if p.actual is not None else "—"
        lines.append(
            f"| {p.label} | {p.step} | {p.point:.4f} | [{p.low:.4f}, {p.high:.4f}] | {actual} "
            f"| {p.state_text} |"
        )
    return lines


def tracking_section(steps: Sequence[StepView]) -> list[str]:
    """Status-comment lines for every running or finished step tracked against a prediction."""
    lines: list[str] = []
    for step in steps:
        found = track(step.output_path) if step.status in ("RUNNING", "SUCCESS") else None
        if found is not None:
            lines += _tracked_step_lines(step.name, *found)
    return lines


# ---- posting records -------------------------------------------------------------------------------------


def _gates_line(record: Prediction) -> str:
    """What the step's own gates flagged before the target ran."""
    rules = f"\n\n{record.rules_line()}" if record.rules_line() else ""
    if record.warnings is None:
        return "Gates: not recorded (an older record)" + rules
    mark = f"⚠️ gates fired ({', '.join(record.gates_flagged)}); " if record.flagged else ""
    return mark + "Gates (recorded, not enforced): " + ("; ".join(record.warnings) or "none flagged") + rules


def prediction_body(record: Prediction) -> str:
    """The never-edited comment of a prediction: marker, table, hash, the step's summary, the record."""
    sha = str(record.sha256)
    rows = [f"| {p.label} | {p.step} | {p.point:.4f} | [{p.low:.4f}, {p.high:.4f}] |" for p in record.points]
    full = {**record.to_json(), HASH_KEY: sha}
    return "\n".join(
        [
            PREDICTION_MARKER.format(sha=sha),
            f"### 🔒 Pre-registered prediction for `{record.target}` ({record.metric})",
            "",
            f"Frozen before the target's first step. Record sha256 `{sha}`; target config hash "
            f"`{record.target_config_hash}`. This comment is never edited.",
            "",
            "| Point | Step | Predicted | 90% interval |",
            "|---|---|---|---|",
            *rows,
            *[line for s in record.summary or () for line in ("", s)],
            "",
            "Assumptions: " + ("; ".join(record.assumptions or ()) or "none stated"),
            "",
            _gates_line(record),
            "",
            "<details><summary>The record (prediction.json)</summary>",
            "",
            "```json",
            json.dumps(full, indent=1, sort_keys=True)[:40_000],
            "```",
            "</details>",
        ]
    )


def verdict_body(verdict: Verdict) -> str:
    """The comment of a verdict, quoting the prediction's hash."""
    rows = [
        f"| {p.band.label} | {p.band.step} | {p.band.point:.4f} | [{p.band.low:.4f}, {p.band.high:.4f}] | "
        f"{p.actual:.4f} | {p.error_pct:+.2f}% | {'✅ inside' if p.inside else '❌ outside'} |"
        for p in verdict.points
    ]
    end = verdict.endpoint
    return "\n".join(
        [
            VERDICT_MARKER.format(sha=verdict.sha256),
            f"### Verdict on prediction `{verdict.prediction_sha256}` ({verdict.metric})",
            "",
            f"Endpoint: predicted {end.band.point:.4f}, actual {end.actual:.4f}, error {end.error_pct:+.2f}% "
            f"((predicted - actual) / actual; {'inside' if end.inside else 'outside'} the 90% interval): "
            f"{error_words(end.error_pct, verdict.metric)}. "
            f"{verdict.hits}/{len(verdict.points)} points inside. Verdict sha256 `{verdict.sha256}`."
            + "".join(f" {s}" for s in verdict.summary or ()),
            "",
            "| Point | Step | Predicted | 90% interval | Actual | Error | |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def note_body(note: Note) -> str:
    """The comment of a note on a prediction, quoting the prediction's hash."""
    return "\n".join(
        [
            NOTE_MARKER.format(sha=note.sha256),
            f"### {note.title} (prediction `{note.prediction_sha256}`)",
            "",
            note.text,
            "",
            f"Note sha256 `{note.sha256}`.",
        ]
    )


def post_record(tracker: Tracker, number: int, marker: str, body: str) -> Comment:
    """The comment starting with ``marker``, created with ``body`` if there is none (never edited)."""
    for comment in tracker.list_comments(number):
        if comment.body.startswith(marker):
            return comment
    return tracker.create_comment(number, body)


class PredictionPublisher:
    """Posts predictions, verdicts and notes of a run's steps to issue ``number`` (the module docstring)."""

    name = "predictions"

    def __init__(self, tracker: Tracker, number: int) -> None:
        self.tracker, self.number = tracker, number
        self._done: set[str] = set()

    def publish(self, run: RunView, final: bool) -> None:
        for step in run.steps:
            if step.status != "SUCCESS" or step.output_path in self._done:
                continue
            self._handle(step.output_path.rstrip("/"))
            self._done.add(step.output_path)

    def _handle(self, root: str) -> None:
        raw = read_record(f"{root}/{PREDICTION_FILE}")
        if raw is not None:
            self._post_prediction(root, raw)
        # a sealed verdict or note the engine cannot read is an error the run's publisher report names
        # (RecordFormatError names the field), not a comment silently left out
        path = f"{root}/{VERDICT_FILE}"
        raw = read_record(path)
        if is_sealed(raw):
            verdict = Verdict.from_json(raw, path)
            marker = VERDICT_MARKER.format(sha=verdict.sha256)
            post_record(self.tracker, self.number, marker, verdict_body(verdict))
        path = f"{root}/{NOTE_FILE}"
        raw = read_record(path)
        if is_sealed(raw):
            note = Note.from_json(raw, path)
            post_record(self.tracker, self.number, NOTE_MARKER.format(sha=note.sha256), note_body(note))

    def _ensure_issue(self, record: Prediction) -> None:
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
                title=str(record.experiment or "experiment"),
                body=f"Experiment `{record.experiment}`.",
            )

    def _post_prediction(self, root: str, raw: Any) -> None:
        if not is_sealed(raw):
            raise ValueError(
                f"{root}/{PREDICTION_FILE} does not match its record_sha256: it was edited after "
                "it was written, so it is not posted"
            )
        record = Prediction.from_json(raw, f"{root}/{PREDICTION_FILE}")
        assert record.sha256 is not None  # is_sealed checked it
        posted = read_posted(root)
        if posted is not None and posted.prediction_sha256 == record.sha256:
            return
        self._ensure_issue(record)
        marker = PREDICTION_MARKER.format(sha=record.sha256)
        comment = post_record(self.tracker, self.number, marker, prediction_body(record))
        receipt = Posted(
            prediction_sha256=record.sha256,
            issue=f"{self.tracker.repo}#{self.number}",
            comment_id=comment.id,
            comment_url=comment.url,
            comment_created=comment.created,
            posted_at=time.time(),
        )
        write_json_atomic(f"{root}/{POSTED_FILE}", receipt.to_json())


# ---- the calibration view ------------------------------------------------------------------------------


def _find(fs: Any, root: str, filename: str) -> list[str]:
    """Every file named `filename` under `root` (fs.glob's `root/**/filename`); on a local disk one os.scandir
    walk, which does not descend into symlinked folders either (fsspec's walk stats each entry through
    several layers: the dashboard's and the static site's predictions lists were most of their cost at
    77,000 files)."""
    if not isinstance(fs, LocalFileSystem):
        return list(fs.glob(f"{root}/**/{filename}"))
    found, stack = [], [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(f"{folder}/{e.name}")
                    elif e.name == filename:
                        found.append(f"{folder}/{e.name}")
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def _records(prefix: str, filename: str) -> list[tuple[str, Any]]:
    fs, root = fsspec.core.url_to_fs(prefix)
    found = []
    for path in sorted(_find(fs, root.rstrip("/"), filename)):
        if "/.marin/" in path or "/checkpoints/" in path:
            continue
        found.append(
            (fs.unstrip_protocol(path) if "://" in prefix else path, read_record(fs.unstrip_protocol(path)))
        )
    return found


def _listing_row(path: str, raw: Any, verdicts: dict[Any, tuple[str | None, Any]]) -> dict[str, Any]:
    record = sealed_as(Prediction, raw, path)
    sha = raw.get(HASH_KEY) if isinstance(raw, dict) else None
    end = record.endpoint if record is not None else None
    vpath, vraw = (
        verdicts.get(sha, (None, None)) if record is not None else (None, None)
    )  # a tampered copy: none
    try:
        posted = read_posted(path.rsplit("/", 1)[0])
    except RecordFormatError:
        posted = None  # the listing shows every record it can read, as for a malformed prediction
    verdict = sealed_as(Verdict, vraw, str(vpath)) if vraw is not None else None
    vend = verdict.endpoint if verdict is not None else None
    return {
        "path": path,
        "verified": record is not None,
        "sha256": sha,
        "experiment": record.experiment if record else None,
        "issue": record.issue if record else None,
        "target": record.target if record else None,
        "metric": record.metric if record else None,
        "point": end.point if end else None,
        "low": end.low if end else None,
        "high": end.high if end else None,
        "posted": posted.to_json() if posted is not None and posted.prediction_sha256 == sha else None,
        "verdict_path": vpath,
        "verdict_verified": is_sealed(vraw) if vraw else None,
        "actual": vend.actual if vend else None,
        "error_pct": vend.error_pct if vend else None,
        "error_words": error_words(vend.error_pct, verdict.metric) if vend and verdict else None,
        "inside": vend.inside if vend else None,
        "points_inside": f"{verdict.hits}/{len(verdict.points)}" if verdict else None,
        **_ladder_columns(record),
    }


def _ladder_columns(record: Prediction | None) -> dict[str, Any]:
    """The recipe and compute share a ladder's record states (``ladder``; None for other records), the gates
    that fired before the run and, for a forecast made under the interval rules before issue 34, the line
    that says so (every surface shows both)."""
    ladder = record.details.get("ladder") if record is not None else None
    flags = {"gates_flagged": list(record.gates_flagged) if record is not None else [],
             "rules_line": record.rules_line() if record is not None else None}
    if not isinstance(ladder, dict):
        return {"recipe": None, "compute_share": None, **flags}
    return {"recipe": ladder.get("recipe"), "compute_share": ladder.get("compute_share"), **flags}


def list_predictions(prefix: str) -> dict[str, Any]:
    """Every prediction under ``prefix`` with its verdict, and the hit rate of the scored intervals."""
    # paired by the raw key, not Verdict.from_json: a verdict edited after sealing no longer reads as one (its
    # error_pct no longer matches), and the listing must still pair it to show it as not verified
    verdicts: dict[Any, tuple[str | None, Any]] = {
        v.get("prediction_sha256"): (path, v)
        for path, v in _records(prefix, VERDICT_FILE)
        if isinstance(v, dict)
    }
    rows = [_listing_row(path, raw, verdicts) for path, raw in _records(prefix, PREDICTION_FILE)]
    scored = [r for r in rows if r["inside"] is not None]
    return {
        "prefix": prefix,
        "predictions": rows,
        "scored": len(scored),
        "hit_rate": (sum(bool(r["inside"]) for r in scored) / len(scored)) if scored else None,
    }
