"""Keep credentials out of everything the platform writes: logs, manifests, events, comments, the dashboard.

:func:`redact` replaces (1) every secret registered with :func:`register_secret` and the current value of the
token environment variables, and (2) anything shaped like a credential: GitHub token formats
(``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``, ``github_pat_``), ``Authorization: token|Bearer ...`` headers
and ``user:password@`` in URLs. The tracker passes every error message and every comment body through it, and
:class:`RedactingFilter` does the same for log records.
"""

from __future__ import annotations

import logging
import os
import re
import threading

MASK = "***"
TOKEN_ENV_VARS = ("GITHUB_TOKEN", "GH_TOKEN", "MARIN_GITHUB_TOKEN")

# each with the literals one of which every match contains: a text holding none of them is not scanned
_PATTERNS = (
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{16,}\b"), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"), ("github_pat_",)),
)
_AUTH_HEADER = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(?:token|bearer|basic)\s+)[^\s'\",}]+")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")

_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret so every later :func:`redact` masks it (values shorter than 6 chars are ignored:
    masking them would mangle ordinary text and they are not real tokens)."""
    if value and len(value) >= 6:
        with _lock:
            _secrets.add(value)


def _known_secrets() -> list[str]:
    env = [os.environ.get(name, "") for name in TOKEN_ENV_VARS]
    with _lock:
        found = {s for s in (*_secrets, *env) if s and len(s) >= 6}
    # longest first, so a secret containing another is masked whole
    return sorted(found, key=len, reverse=True)


def known_secrets() -> list[str]:
    """The secrets :func:`redact` replaces verbatim now (registered, and the token variables' values)."""
    return _known_secrets()


def redact(text: str) -> str:
    """``text`` with every known secret and credential-shaped substring replaced by ``***``."""
    for secret in _known_secrets():
        text = text.replace(secret, MASK)
    for pattern, literals in _PATTERNS:
        if any(x in text for x in literals):
            text = pattern.sub(MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
    if "://" not in text or "@" not in text:  # both are in every match
        return text
    return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)


class RedactingFilter(logging.Filter):
    """A logging filter that renders each record's message and redacts it (attach it to a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
