"""The records of pre-registered predictions, in one place: the step that writes them (``operators``) and the
engine that posts, tracks and lists them (``marin``) both import this package, which imports neither.

- :mod:`.sealed` — canonical JSON, ``record_sha256``, sealing, and reading/writing JSON on any fsspec store
  (one missing-file behaviour: ``read_json`` returns None);
- :mod:`.schema` — the typed, frozen records (:class:`Prediction`, :class:`Posted`, :class:`Verdict`,
  :class:`Tracking`, :class:`Note`), their file names and schema versions, and :func:`error_pct`, the one
  sign convention: ``(predicted - actual) / actual``.
"""

from openlab_records.schema import (
    NOTE_FILE,
    NOTE_SCHEMA,
    POSTED_FILE,
    PREDICTION_FILE,
    PREDICTION_SCHEMA,
    PREDICTION_SCHEMAS,
    TRACKING_FILE,
    TRACKING_SCHEMA,
    VERDICT_FILE,
    VERDICT_SCHEMA,
    Band,
    Note,
    Posted,
    Prediction,
    Scored,
    Tracking,
    Verdict,
    error_pct,
    error_words,
)
from openlab_records.sealed import (
    HASH_KEY,
    RecordFormatError,
    RecordTamperedError,
    canonical_json,
    is_sealed,
    read_json,
    read_sealed,
    record_hash,
    seal,
    write_json_atomic,
    write_sealed,
)

__all__ = [
    "HASH_KEY",
    "NOTE_FILE",
    "NOTE_SCHEMA",
    "POSTED_FILE",
    "PREDICTION_FILE",
    "PREDICTION_SCHEMA",
    "PREDICTION_SCHEMAS",
    "TRACKING_FILE",
    "TRACKING_SCHEMA",
    "VERDICT_FILE",
    "VERDICT_SCHEMA",
    "Band",
    "Note",
    "Posted",
    "Prediction",
    "RecordFormatError",
    "RecordTamperedError",
    "Scored",
    "Tracking",
    "Verdict",
    "canonical_json",
    "error_pct",
    "error_words",
    "is_sealed",
    "read_json",
    "read_sealed",
    "record_hash",
    "seal",
    "write_json_atomic",
    "write_sealed",
]
