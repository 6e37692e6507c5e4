"""The cluster launcher configs in infra/ pass Ray's own schema validation, offline.

Ray's `prepare_config` merges the provider defaults without any cloud call, and `validate_config` checks the
result against `ray-schema.json`; a typo in a key or a fractional resource is caught here, not at `ray up`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

INFRA = Path(__file__).resolve().parents[2] / "infra"
CONFIGS = sorted(INFRA.glob("ray-cluster-*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_configs_exist() -> None:
    assert {p.name for p in CONFIGS} >= {"ray-cluster-gcp-tpu.yaml", "ray-cluster-gcp-gpu.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_cluster_config_validates(path: Path) -> None:
    config = _load(path)
    validate_config(prepare_config(config))
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"]["CPU"] == 0, "steps must never be scheduled on the head node"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_misspelt_key_is_rejected(path: Path) -> None:
    config = copy.deepcopy(_load(path))
    node = next(iter(config["available_node_types"].values()))
    node["resourcez"] = node.pop("resources")
    with pytest.raises(Exception, match="resourcez"):
        validate_config(prepare_config(config))
