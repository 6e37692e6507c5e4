"""The prediction protocol's records as frozen, typed values: what a step writes and what the engine reads.

Five files, each a JSON object (docs/scaling-ladder.md, "Records"):

- ``prediction.json`` (:class:`Prediction`, sealed): the forecast of a run's metric at its evaluation
  points, frozen before the run starts;
- ``posted.json`` (:class:`Posted`): the engine's receipt, next to a prediction, that it is on its issue
  (the comment that holds it); the target waits for it before training;
- ``verdict.json`` (:class:`Verdict`, sealed): the run's actual values scored against a prediction;
- ``tracking.json`` (:class:`Tracking`): written by the run scored against a prediction, naming it and where
  its metric lands (rows of ``metrics.jsonl``);
- ``note.json`` (:class:`Note`, sealed): something found out about a prediction after it was frozen.

Each typed value holds the fields every reader needs; everything else the writing step recorded (the fit, its
inputs, the gates, a ladder's endpoint rule) stays in ``details``, which a reader may show but never needs.
``from_json(obj).to_json()`` gives back ``obj`` exactly (minus ``record_sha256``), so records written before
these types existed still read and still verify by hash; ``from_json`` refuses a record without a field it
needs, naming the field.

**The sign of an error.** One convention, on every surface (verdict, status comment, dashboard, alert,
catalogue): ``error = (predicted - actual) / actual`` (:func:`error_pct`, in %). Positive: the forecast was
too high (the run came in below it); negative: too low.

**Interval rules (issue 34).** A prediction written since issue 34 names its interval rules and the gates that
fired in ``details`` (``interval_rules``, ``gates_flagged``); :attr:`Prediction.interval_rules` reads
``"before-issue-34"`` for one without (every sealed record before then, which still verifies by hash), and
:meth:`Prediction.rules_line` is the line a surface shows under such a forecast.

**Versions.** ``marin-prediction/v2`` adds ``summary``: lines the writing step rendered for people (its law,
its endpoint rule), which the engine posts as they are, so the engine needs no knowledge of any science;
``v1`` records (without it) still read. ``marin-verdict/v1`` gains the same optional ``summary``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Self

from openlab_records.sealed import HASH_KEY, RecordFormatError

PREDICTION_SCHEMA = "marin-prediction/v2"
PREDICTION_SCHEMAS = ("marin-prediction/v1", PREDICTION_SCHEMA)
OLD_INTERVAL_RULES = "before-issue-34"
"""What :attr:`Prediction.interval_rules` says of a record written without ``interval_rules`` (operators'
``bootstrap.INTERVAL_RULES_V1``: the same text)."""
SECOND_ISSUE34_RULES = "issue-34/2"
"""The second interval rules of issue 34 (operators' ``bootstrap.INTERVAL_RULES_ISSUE34_SECOND``), replaced
by ``issue-34/3`` (a floor of 0.5% per decade instead of 0.75%): a record made under them says so when
shown."""
FIRST_ISSUE34_RULES = "issue-34"
"""The first interval rules of issue 34 (operators' ``bootstrap.INTERVAL_RULES_ISSUE34_FIRST``), replaced by
``issue-34/2``: a record made under them says so when shown."""
VERDICT_SCHEMA = "marin-verdict/v1"
TRACKING_SCHEMA = "marin-tracking/v1"
NOTE_SCHEMA = "marin-prediction-note/v1"
PREDICTION_FILE, VERDICT_FILE, TRACKING_FILE, NOTE_FILE, POSTED_FILE = (
    "prediction.json",
    "verdict.json",
    "tracking.json",
    "note.json",
    "posted.json",
)


def error_pct(predicted: float, actual: float) -> float:
    """The signed forecast error in %: ``100 * (predicted - actual) / actual`` (positive: too high)."""
    if not math.isfinite(actual) or actual == 0:
        return math.nan
    return 100.0 * (predicted - actual) / actual


def error_words(error: float, metric: str = "metric") -> str:
    """The signed error in plain words, written next to the number on every surface:
    ``-11.83%`` -> "the run's micro.bpb came out higher than forecast (the forecast was 11.83% too low)".
    The percentage is the same number without its sign, so the words can never disagree with it."""
    if not math.isfinite(error):
        return f"the run's {metric} could not be compared with the forecast"
    if round(error, 2) == 0:
        return f"the run's {metric} came out as forecast (within 0.005%)"
    way, fault = ("higher", "low") if error < 0 else ("lower", "high")
    return f"the run's {metric} came out {way} than forecast (the forecast was {abs(error):.2f}% too {fault})"


def _need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise RecordFormatError(f"{where}: the record has no {key!r}; it is not a record of this schema")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _kinds(kind):
        raise RecordFormatError(f"{where}.{key} = {value!r} is not {_names(kind)}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _kinds(kind))


def _optional_lines(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    if key not in obj:
        return None
    value = _need(obj, key, list, where)
    if not all(isinstance(v, str) for v in value):
        raise RecordFormatError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _rest(obj: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known and k != HASH_KEY}


def _lines(key: str, value: tuple[str, ...] | None) -> dict[str, Any]:
    return {} if value is None else {key: list(value)}


NUMBER = (int, float)


@dataclasses.dataclass(frozen=True)
class Band:
    """One predicted point: the metric's point estimate and 90% interval at a step of the run."""

    label: str
    step: int
    point: float
    low: float
    high: float
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Everything else the step recorded at this point (its fit, leave-one-out forecasts, gates...)."""

    KEYS = ("label", "step", "point", "low", "high")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str) -> Self:
        return cls(
            label=_need(obj, "label", str, where),
            step=_need(obj, "step", int, where),
            point=_need(obj, "point", NUMBER, where),
            low=_need(obj, "low", NUMBER, where),
            high=_need(obj, "high", NUMBER, where),
            details=_rest(obj, cls.KEYS),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "label": self.label,
            "step": self.step,
            "point": self.point,
            "low": self.low,
            "high": self.high,
        }

    def inside(self, actual: float) -> bool:
        return math.isfinite(actual) and self.low <= actual <= self.high


@dataclasses.dataclass(frozen=True)
class Prediction:
    """``prediction.json``: a run's metric forecast at its evaluation points, sealed before the run."""

    metric: str
    """The metric's name (e.g. ``micro.bpb``)."""
    metric_path: str
    """Where the run's rows carry it (e.g. ``eval.micro.bpb`` in metrics.jsonl)."""
    target: str
    """The run forecast (a step name)."""
    target_config_hash: str
    """The identity hash of the run's config when it was forecast: a run whose config differs is refused."""
    points: tuple[Band, ...]
    experiment: str | None = None
    issue: str | None = None
    assumptions: tuple[str, ...] | None = None
    warnings: tuple[str, ...] | None = None
    """What the step's own gates flagged before the run (None: a record that did not record its gates)."""
    summary: tuple[str, ...] | None = None
    """Lines the step rendered for people (its law, its endpoint rule), posted as they are."""
    metric_details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    target_details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema: str = PREDICTION_SCHEMA
    sha256: str | None = None
    """The record's ``record_sha256`` when it was read from a sealed file."""

    KEYS = (
        "schema",
        "metric",
        "target",
        "points",
        "experiment",
        "issue",
        "assumptions",
        "warnings",
        "summary",
    )

    @property
    def endpoint(self) -> Band:
        return self.points[-1]

    @property
    def interval_rules(self) -> str:
        """The interval rules the forecast was made under (``details["interval_rules"]``, written since issue
        34); a record without it was made under the old rules, :data:`OLD_INTERVAL_RULES`."""
        return str(self.details.get("interval_rules", OLD_INTERVAL_RULES))

    @property
    def gates_flagged(self) -> tuple[str, ...]:
        """The names of the gates that fired before the run (``details["gates_flagged"]``, since issue 34);
        for an older record, ``("unnamed",)`` when it has warnings and none otherwise."""
        if "gates_flagged" in self.details:
            return tuple(self.details["gates_flagged"])
        return ("unnamed",) if self.warnings else ()

    @property
    def flagged(self) -> bool:
        """Whether any gate fired: what every surface marks next to the forecast."""
        return bool(self.gates_flagged)

    def rules_line(self) -> str | None:
        """A line for a surface to show under a forecast made under earlier interval rules; None otherwise."""
        if self.interval_rules == SECOND_ISSUE34_RULES:
            return (
                "Made under issue 34's second interval rules: where the ladder had no seeds, its model error "
                "had a floor of 0.75% per decade (now 0.5%, chosen by coverage nearest 90% on published "
                "ladders); otherwise as now."
            )
        if self.interval_rules == FIRST_ISSUE34_RULES:
            return (
                "Made under issue 34's first interval rules: where the ladder had no seeds, its model error "
                "had no floor and the mean's interval left out the runs' scatter about the law (with seeds, "
                "its intervals are what the current rules give)."
            )
        if self.interval_rules != OLD_INTERVAL_RULES:
            return None
        return (
            "Made under the interval rules before issue 34 (sigma the plain residual spread or one pair's, "
            "no floor on it, no model-error term): its interval may be narrower than the data support."
        )

    @classmethod
    def from_json(cls, obj: Any, where: str = PREDICTION_FILE) -> Self:
        if not isinstance(obj, Mapping):
            raise RecordFormatError(f"{where} is not a JSON object")
        schema = _need(obj, "schema", str, where)
        if schema not in PREDICTION_SCHEMAS:
            raise RecordFormatError(
                f"{where}: schema {schema!r} is not one of {', '.join(PREDICTION_SCHEMAS)}"
            )
        metric = _need(obj, "metric", dict, where)
        target = _need(obj, "target", dict, where)
        points = _need(obj, "points", list, where)
        if not points:
            raise RecordFormatError(f"{where}.points is empty: a prediction needs at least one point")
        return cls(
            schema=schema,
            metric=_need(metric, "name", str, f"{where}.metric"),
            metric_path=_need(metric, "path", str, f"{where}.metric"),
            metric_details=_rest(metric, ("name", "path")),
            target=_need(target, "name", str, f"{where}.target"),
            target_config_hash=_need(target, "config_hash", str, f"{where}.target"),
            target_details=_rest(target, ("name", "config_hash")),
            points=tuple(Band.from_json(p, f"{where}.points[{i}]") for i, p in enumerate(points)),
            experiment=obj.get("experiment"),
            issue=obj.get("issue"),
            assumptions=_optional_lines(obj, "assumptions", where),
            warnings=_optional_lines(obj, "warnings", where),
            summary=_optional_lines(obj, "summary", where),
            details=_rest(obj, cls.KEYS),
            sha256=obj.get(HASH_KEY),
        )

    def to_json(self) -> dict[str, Any]:
        """The record's JSON body (without ``record_sha256``: :func:`openlab_records.seal` adds it)."""
        return {
            **self.details,
            "schema": self.schema,
            "metric": {**self.metric_details, "name": self.metric, "path": self.metric_path},
            "target": {**self.target_details, "name": self.target, "config_hash": self.target_config_hash},
            "points": [p.to_json() for p in self.points],
            "experiment": self.experiment,
            "issue": self.issue,
            **_lines("assumptions", self.assumptions),
            **_lines("warnings", self.warnings),
            **_lines("summary", self.summary),
        }


@dataclasses.dataclass(frozen=True)
class Scored:
    """One point of a verdict: the prediction's band there and the run's actual value."""

    band: Band
    actual: float
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def error_pct(self) -> float:
        return error_pct(self.band.point, self.actual)

    @property
    def inside(self) -> bool:
        return self.band.inside(self.actual)

    KEYS = (*Band.KEYS, "actual", "error_pct", "inside")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str) -> Self:
        band = Band.from_json(obj, where)
        scored = cls(
            band=dataclasses.replace(band, details={}),
            actual=_need(obj, "actual", NUMBER, where),
            details=_rest(obj, cls.KEYS),
        )
        recorded = _need(obj, "error_pct", NUMBER, where)
        if not math.isclose(recorded, scored.error_pct, rel_tol=1e-9, abs_tol=1e-12):
            raise RecordFormatError(
                f"{where}.error_pct = {recorded} is not (predicted - actual) / actual = {scored.error_pct}: "
                "the record was written with another sign convention"
            )
        return scored

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            **self.band.to_json(),
            "actual": self.actual,
            "error_pct": self.error_pct,
            "inside": self.inside,
        }


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``verdict.json``: a run's actual values scored against a sealed prediction, point by point."""

    prediction_sha256: str
    metric: str
    target: str
    points: tuple[Scored, ...]
    experiment: str | None = None
    issue: str | None = None
    summary: tuple[str, ...] | None = None
    """Lines the verdict step rendered for people (e.g. how a second forecast kept beside the registered one
    scored), posted as they are."""
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema: str = VERDICT_SCHEMA
    sha256: str | None = None

    KEYS = (
        "schema",
        "prediction_sha256",
        "metric",
        "target",
        "points",
        "endpoint",
        "hits",
        "n",
        "experiment",
        "issue",
        "summary",
    )

    @property
    def endpoint(self) -> Scored:
        return self.points[-1]

    @property
    def hits(self) -> int:
        return sum(p.inside for p in self.points)

    @classmethod
    def from_json(cls, obj: Any, where: str = VERDICT_FILE) -> Self:
        if not isinstance(obj, Mapping):
            raise RecordFormatError(f"{where} is not a JSON object")
        schema = _need(obj, "schema", str, where)
        if schema != VERDICT_SCHEMA:
            raise RecordFormatError(f"{where}: schema {schema!r} is not {VERDICT_SCHEMA}")
        points = _need(obj, "points", list, where)
        if not points:
            raise RecordFormatError(f"{where}.points is empty: a verdict scores at least one point")
        verdict = cls(
            schema=schema,
            prediction_sha256=_need(obj, "prediction_sha256", str, where),
            metric=_need(obj, "metric", str, where),
            target=_need(obj, "target", str, where),
            points=tuple(Scored.from_json(p, f"{where}.points[{i}]") for i, p in enumerate(points)),
            experiment=obj.get("experiment"),
            issue=obj.get("issue"),
            summary=_optional_lines(obj, "summary", where),
            details=_rest(obj, cls.KEYS),
            sha256=obj.get(HASH_KEY),
        )
        if (obj.get("hits"), obj.get("n")) != (verdict.hits, len(verdict.points)):
            raise RecordFormatError(
                f"{where}: hits/n {obj.get('hits')}/{obj.get('n')} do not match its points "
                f"({verdict.hits}/{len(verdict.points)})"
            )
        return verdict

    def to_json(self) -> dict[str, Any]:
        rows = [p.to_json() for p in self.points]
        return {
            **self.details,
            "schema": self.schema,
            "prediction_sha256": self.prediction_sha256,
            "experiment": self.experiment,
            "issue": self.issue,
            "metric": self.metric,
            "target": self.target,
            "points": rows,
            "endpoint": rows[-1],
            "hits": self.hits,
            "n": len(rows),
            **_lines("summary", self.summary),
        }


@dataclasses.dataclass(frozen=True)
class Tracking:
    """``tracking.json``: the run scored against a prediction names it, and where its metric lands."""

    prediction: str
    """The prediction record's path."""
    prediction_sha256: str
    metric_path: str
    metrics_file: str = "metrics.jsonl"
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema: str = TRACKING_SCHEMA

    KEYS = ("schema", "prediction", HASH_KEY, "metric_path", "metrics_file")

    @classmethod
    def from_json(cls, obj: Any, where: str = TRACKING_FILE) -> Self:
        if not isinstance(obj, Mapping):
            raise RecordFormatError(f"{where} is not a JSON object")
        return cls(
            prediction=_need(obj, "prediction", str, where),
            prediction_sha256=_need(obj, HASH_KEY, str, where),
            metric_path=_need(obj, "metric_path", str, where),
            metrics_file=obj.get("metrics_file", "metrics.jsonl"),
            details={k: v for k, v in obj.items() if k not in cls.KEYS},
            schema=obj.get("schema", TRACKING_SCHEMA),
        )

    def to_json(self) -> dict[str, Any]:
        # the prediction's hash sits under record_sha256 (the v1 layout): tracking.json itself is not sealed
        return {
            **self.details,
            "schema": self.schema,
            "prediction": self.prediction,
            HASH_KEY: self.prediction_sha256,
            "metrics_file": self.metrics_file,
            "metric_path": self.metric_path,
        }


@dataclasses.dataclass(frozen=True)
class Note:
    """``note.json``: a finding about a frozen prediction (e.g. whether the run's learning rate was best)."""

    prediction_sha256: str
    title: str
    text: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema: str = NOTE_SCHEMA
    sha256: str | None = None

    KEYS = ("schema", "prediction_sha256", "title", "text")

    @classmethod
    def from_json(cls, obj: Any, where: str = NOTE_FILE) -> Self:
        if not isinstance(obj, Mapping):
            raise RecordFormatError(f"{where} is not a JSON object")
        return cls(
            prediction_sha256=_need(obj, "prediction_sha256", str, where),
            title=_need(obj, "title", str, where),
            text=_need(obj, "text", str, where),
            details=_rest(obj, cls.KEYS),
            schema=obj.get("schema", NOTE_SCHEMA),
            sha256=obj.get(HASH_KEY),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "schema": self.schema,
            "prediction_sha256": self.prediction_sha256,
            "title": self.title,
            "text": self.text,
        }


@dataclasses.dataclass(frozen=True)
class Posted:
    """``posted.json``: the engine's receipt that a prediction is posted to its issue, written next to the
    record once the comment exists (the target step waits for it)."""

    prediction_sha256: str
    """The posted prediction's hash (under ``record_sha256``, as in tracking.json: posted.json is not
    sealed)."""
    issue: str
    """The issue, as ``owner/repo#number``."""
    comment_id: int
    comment_url: str
    comment_created: float
    """When the tracker created the comment (seconds since the epoch)."""
    posted_at: float
    """When the engine wrote this receipt (seconds since the epoch)."""
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    KEYS = (HASH_KEY, "issue", "comment_id", "comment_url", "comment_created", "posted_at")

    @classmethod
    def from_json(cls, obj: Any, where: str = POSTED_FILE) -> Self:
        if not isinstance(obj, Mapping):
            raise RecordFormatError(f"{where} is not a JSON object")
        return cls(
            prediction_sha256=_need(obj, HASH_KEY, str, where),
            issue=_need(obj, "issue", str, where),
            comment_id=_need(obj, "comment_id", int, where),
            comment_url=_need(obj, "comment_url", str, where),
            comment_created=_need(obj, "comment_created", NUMBER, where),
            posted_at=_need(obj, "posted_at", NUMBER, where),
            details={k: v for k, v in obj.items() if k not in cls.KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        """The receipt's JSON, its keys in the order posted.json is written in (sorted), so a listing that
        shows the receipt shows it as it was read."""
        body = {
            **self.details,
            HASH_KEY: self.prediction_sha256,
            "issue": self.issue,
            "comment_id": self.comment_id,
            "comment_url": self.comment_url,
            "comment_created": self.comment_created,
            "posted_at": self.posted_at,
        }
        return dict(sorted(body.items()))
