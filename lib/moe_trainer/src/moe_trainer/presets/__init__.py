"""Presets: full ``TrainConfig`` YAML files shipped with the package, loaded by name.

``load_preset("tiny")`` returns the parsed, validated ``TrainConfig``; ``python -m moe_trainer.train --config
tiny`` uses the same files. Names are the YAML file stems in this directory.
"""

from __future__ import annotations

from importlib import resources

import draccus

from moe_trainer.train_config import TrainConfig


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    files = resources.files(__name__).iterdir()
    return sorted(p.name[: -len(".yaml")] for p in files if p.name.endswith(".yaml"))


def preset_path(name: str) -> str:
    """Filesystem path of preset ``name``; raises ValueError listing the valid names."""
    names = preset_names()
    if name not in names:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(names)} (or pass a YAML path)")
    return str(resources.files(__name__) / f"{name}.yaml")


def load_preset(name: str) -> TrainConfig:
    """The ``TrainConfig`` of preset ``name`` (see ``preset_names()``)."""
    return draccus.parse(TrainConfig, config_path=preset_path(name), args=[])
