"""Reusable step functions: each a frozen config dataclass plus a plain function. Never imports ``marin``."""
