"""The redaction helper masks registered secrets, token environment variables and credential-shaped text."""

from __future__ import annotations

import logging

import pytest

from marin.tracking.redact import MASK, RedactingFilter, redact, register_secret


def test_registered_secret_and_env_token_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    register_secret("s3cr3t-value-XYZ")
    monkeypatch.setenv("GITHUB_TOKEN", "plain-env-token-123")
    text = "a s3cr3t-value-XYZ b plain-env-token-123 c"
    assert redact(text) == f"a {MASK} b {MASK} c"


@pytest.mark.parametrize("text", [
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "gho_ABCDEFGHIJKLMNOPQRST1234",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "Authorization: token 0123456789abcdef0123",
    "{'Authorization': 'Bearer eyJhbGciOi.payload.sig'}",
    "https://x-access-token:0123456789abcdef@github.com/o/r.git",
], ids=["ghp", "gho", "fine-grained", "header", "bearer-dict", "url-userinfo"])
def test_credential_shapes_are_masked(text: str) -> None:
    out = redact(f"before {text} after")
    assert MASK in out and out.startswith("before ") and out.endswith(" after")
    secret_part = text.split()[-1].split(":")[-1].strip("'}").split("@")[0]
    assert secret_part not in out


def test_ordinary_text_is_untouched() -> None:
    text = "step train/tiny failed: ValueError: lr must be positive (see https://github.com/o/r/issues/3)"
    assert redact(text) == text
    register_secret("abc")  # too short to be a token: ignored, so ordinary words survive
    assert redact("abcdef abc") == "abcdef abc"


def test_logging_filter_redacts_messages_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    register_secret("log-secret-0123456789")
    logger = logging.getLogger("test.redact")
    caplog.handler.addFilter(RedactingFilter())
    try:
        logger.warning("calling with %s", "log-secret-0123456789")
        try:
            raise RuntimeError("boom log-secret-0123456789")
        except RuntimeError:
            logger.exception("failed")
    finally:
        caplog.handler.filters.clear()
    assert "log-secret-0123456789" not in caplog.text
    assert "calling with ***" in caplog.text and "RuntimeError: boom ***" in caplog.text
