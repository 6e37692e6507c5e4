"""The status web dashboard: a thin, read-only FastAPI app over the files under a prefix
(docs/dashboard.md)."""

from marin.dashboard.app import create_app

__all__ = ["create_app"]
