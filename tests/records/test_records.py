"""The typed records (openlab_records): records written before the types existed read back exactly and verify
by hash; a malformed record is refused naming its field; one sign convention for every error."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openlab_records import (
    HASH_KEY,
    POSTED_FILE,
    Posted,
    Prediction,
    RecordFormatError,
    RecordTamperedError,
    Verdict,
    error_pct,
    is_sealed,
    read_json,
    read_sealed,
    record_hash,
    seal,
    write_json_atomic,
    write_sealed,
)

V1 = Path(__file__).resolve().parents[1] / "fakes" / "records_v1"


def _v1(name: str) -> dict[str, Any]:
    return json.loads((V1 / name).read_text())


@pytest.mark.parametrize(
    "name",
    [
        "prediction-law.json",
        "prediction-pre_decay_anchor.json",
        "verdict-law.json",
        "verdict-pre_decay_anchor.json",
    ],
    ids=["prediction-law", "prediction-anchor", "verdict-law", "verdict-anchor"],
)
def test_v1_records_read_back_exactly_and_verify(name: str) -> None:
    raw = _v1(name)
    kind = Prediction if name.startswith("prediction") else Verdict
    typed = kind.from_json(raw)
    assert typed.sha256 == raw[HASH_KEY] == record_hash(raw)
    assert typed.to_json() == {k: v for k, v in raw.items() if k != HASH_KEY}
    assert seal(typed.to_json()) == raw


def test_typed_reading_of_a_v1_prediction_and_its_verdict() -> None:
    prediction = Prediction.from_json(_v1("prediction-pre_decay_anchor.json"))
    verdict = Verdict.from_json(_v1("verdict-pre_decay_anchor.json"))
    assert prediction.schema == "marin-prediction/v1" and prediction.summary is None
    assert [p.label for p in prediction.points] == ["25%", "50%", "75%", "100%"]
    assert prediction.metric == "micro.bpb" and prediction.metric_path == "eval.micro.bpb"
    assert prediction.target == "big" and prediction.target_config_hash == "c" * 64
    assert prediction.warnings == () and prediction.assumptions == ("one law through every rung",)
    assert "end_law" in prediction.endpoint.details and "fitter" in prediction.details
    assert verdict.prediction_sha256 == prediction.sha256
    end = verdict.endpoint
    assert end.band.point == prediction.endpoint.point and end.actual == pytest.approx(end.band.point * 0.98)
    # the target came in 2% under the forecast: the forecast was too high, so the error is positive
    assert end.error_pct == pytest.approx(100 * (1 / 0.98 - 1)) and end.error_pct > 0
    assert verdict.hits == 4 and end.inside


def test_the_sign_convention() -> None:
    assert error_pct(1.02, 1.0) == pytest.approx(2.0)  # forecast too high
    assert error_pct(0.98, 1.0) == pytest.approx(-2.0)  # forecast too low
    assert math.isnan(error_pct(1.0, math.nan)) and math.isnan(error_pct(1.0, 0.0))


def test_a_verdict_written_with_the_other_sign_is_refused() -> None:
    raw = _v1("verdict-law.json")
    row = raw["points"][0]
    flipped = {
        **raw,
        "points": [
            {**row, "error_pct": 100 * (row["actual"] - row["point"]) / row["point"]},
            *raw["points"][1:],
        ],
    }
    with pytest.raises(RecordFormatError, match=r"points\[0\].error_pct = .* another sign convention"):
        Verdict.from_json(flipped)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("metric"), "has no 'metric'"),
        (lambda r: r["points"][1].pop("high"), r"points\[1\]: the record has no 'high'"),
        (lambda r: r["points"][0].update(step="25"), r"points\[0\].step = '25' is not int"),
        (lambda r: r["target"].update(config_hash=None), "config_hash = None is not str"),
        (
            lambda r: r.update(schema="marin-prediction/v9"),
            "is not one of marin-prediction/v1, marin-prediction/v2",
        ),
        (lambda r: r.update(points=[]), "points is empty"),
    ],
    ids=["no-metric", "no-high", "step-str", "hash-null", "schema", "no-points"],
)
def test_a_malformed_prediction_is_refused_naming_the_field(edit: Any, message: str) -> None:
    raw = _v1("prediction-law.json")
    edit(raw)
    with pytest.raises(RecordFormatError, match=message):
        Prediction.from_json(raw)


# posted.json as the engine wrote it before the typed receipt (write_json_atomic of its dict): the eleventh
# real ladder's, kept in docs/benchmarks/runs/2026-12-04-scaling-ladder-real-v11.json
POSTED_V11 = """{
 "comment_created": 1796366738.1566396,
 "comment_id": 46,
 "comment_url": "local:local/experiments#15#comment-46",
 "issue": "local/experiments#15",
 "posted_at": 1796366738.1604295,
 "record_sha256": "cf28c4403a55afcbc18bd168e4a2806ac2f22dde917b1642db67315b064b9e7c"
}"""


def test_a_posted_receipt_reads_back_and_writes_the_same_bytes(tmp_path: Path) -> None:
    raw = json.loads(POSTED_V11)
    posted = Posted.from_json(raw)
    assert posted.prediction_sha256 == raw[HASH_KEY] and posted.issue == "local/experiments#15"
    assert posted.comment_id == 46 and posted.comment_url == "local:local/experiments#15#comment-46"
    assert (posted.comment_created, posted.posted_at) == (1796366738.1566396, 1796366738.1604295)
    assert list(posted.to_json().items()) == list(raw.items()) and posted.details == {}  # order too
    write_json_atomic(str(tmp_path / POSTED_FILE), posted.to_json())
    assert (tmp_path / POSTED_FILE).read_text() == POSTED_V11
    extra = {**raw, "by": "a later engine"}  # a field added later is kept, not needed
    assert Posted.from_json(extra).to_json() == extra


@pytest.mark.parametrize("key", Posted.KEYS)
def test_a_posted_receipt_without_a_field_is_refused_naming_it(key: str) -> None:
    raw = json.loads(POSTED_V11)
    del raw[key]
    with pytest.raises(RecordFormatError, match=f"posted.json: the record has no '{key}'"):
        Posted.from_json(raw)


def test_a_posted_receipt_of_the_wrong_shape_is_refused_naming_the_field() -> None:
    with pytest.raises(RecordFormatError, match=r"posted.json.comment_id = '46' is not int"):
        Posted.from_json({**json.loads(POSTED_V11), "comment_id": "46"})
    with pytest.raises(RecordFormatError, match="posted.json is not a JSON object"):
        Posted.from_json([])


def test_sealed_files_round_trip_and_an_edit_is_detected(tmp_path: Path) -> None:
    path = str(tmp_path / "deep" / "prediction.json")
    sealed = write_sealed(path, _v1("prediction-law.json"))
    assert read_sealed(path) == sealed and is_sealed(sealed)
    edited = json.loads(Path(path).read_text())
    edited["points"][-1]["point"] = 1.0
    Path(path).write_text(json.dumps(edited))
    with pytest.raises(RecordTamperedError, match="was edited after it was written"):
        read_sealed(path)
    Path(path).write_text(json.dumps({"points": []}))
    with pytest.raises(RecordTamperedError, match="is not a sealed record"):
        read_sealed(path)
    with pytest.raises(FileNotFoundError, match="no such record"):
        read_sealed(str(tmp_path / "missing.json"))


def test_read_json_has_one_missing_file_behaviour(tmp_path: Path) -> None:
    assert read_json(str(tmp_path / "absent.json")) is None
    (tmp_path / "cut.json").write_text('{"points": [')
    with pytest.raises(RecordFormatError, match="cut.json is not JSON"):
        read_json(str(tmp_path / "cut.json"))
    write_json_atomic(str(tmp_path / "ok.json"), {"b": 1, "a": "é"})
    assert read_json(str(tmp_path / "ok.json")) == {"a": "é", "b": 1}
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), JSON, max_size=6))
def test_the_hash_ignores_key_order_and_only_its_own_key(body: dict[str, Any]) -> None:
    sealed = seal(body)
    assert is_sealed(sealed) and is_sealed(dict(reversed(list(sealed.items()))))
    assert record_hash(sealed) == record_hash(body)
    if body:
        key = next(iter(body))
        changed = {**sealed, key: [sealed[key]]}
        assert not is_sealed(changed)


@pytest.mark.parametrize(
    "name", ["prediction-law.json", "prediction-pre_decay_anchor.json"], ids=["law", "anchor"]
)
def test_a_record_written_under_the_old_interval_rules_says_so_and_still_verifies(name: str) -> None:
    raw = _v1(name)
    typed = Prediction.from_json(raw)
    assert typed.interval_rules == "before-issue-34"
    line = typed.rules_line()
    assert line is not None and "before issue 34" in line and "model-error" in line
    assert typed.flagged == bool(typed.warnings)
    assert seal(typed.to_json()) == raw  # reading the rules changes nothing in the sealed record
