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


def _tpu_types(config: dict) -> dict[str, dict]:
    return {name: node for name, node in config["available_node_types"].items()
            if "acceleratorType" in node.get("node_config", {}) and "machineType" not in node["node_config"]}


def tpu_config_problems(config: dict) -> list[str]:
    """What is wrong with a launcher config's TPU node types, the way Ray's TPU scheduling expects them:
    a slice type from marin's table, one host's chips as the node's TPU resource, and no hand-written
    `TPU-<type>-head` (Ray gives it to worker 0 of each slice; written here, every host would carry it)."""
    from marin.definition.tpu import SLICES

    problems = []
    for name, node in _tpu_types(config).items():
        accel = node["node_config"]["acceleratorType"]
        if accel not in SLICES:
            problems.append(f"{name}: acceleratorType {accel!r} is not a slice type marin knows")
            continue
        resources = node.get("resources", {})
        if resources.get("TPU") != SLICES[accel].chips_per_host:
            chips = SLICES[accel].chips_per_host
            problems.append(f"{name}: resources.TPU must be the chips of one host ({chips})")
        problems += [f"{name}: {key} is hand-written; Ray adds it to worker 0 of each slice"
                     for key in resources if key.startswith("TPU-") and key.endswith("-head")]
    return problems


def test_tpu_slices_are_declared_the_way_ray_expects() -> None:
    config = _load(INFRA / "ray-cluster-gcp-tpu.yaml")
    slices = {node["node_config"]["acceleratorType"] for node in _tpu_types(config).values()}
    assert {"v5p-64", "v4-64", "v5litepod-16", "v6e-32"} <= slices  # multi-host slices, not only single hosts
    assert tpu_config_problems(config) == []


def test_a_hand_written_head_resource_or_a_wrong_chip_count_is_caught() -> None:
    config = copy.deepcopy(_load(INFRA / "ray-cluster-gcp-tpu.yaml"))
    config["available_node_types"]["tpu_v5p_64"]["resources"]["TPU-v5p-64-head"] = 1
    config["available_node_types"]["tpu_v6e_32"]["resources"]["TPU"] = 32
    config["available_node_types"]["tpu_v4_8"]["node_config"]["acceleratorType"] = "v4-9"
    assert tpu_config_problems(config) == [
        "tpu_v4_8: acceleratorType 'v4-9' is not a slice type marin knows",
        "tpu_v5p_64: TPU-v5p-64-head is hand-written; Ray adds it to worker 0 of each slice",
        "tpu_v6e_32: resources.TPU must be the chips of one host (4)"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_node_health_check_is_fast_enough_for_the_recovery_target(path: Path) -> None:
    """Every container runs with Ray's health check every 1,000 ms (docs/benchmarks/cluster_recovery.md:
    with Ray's 3,000 ms a lost host takes ~13 s to be declared dead, past the 10 s recovery target)."""
    options = _load(path)["docker"]["run_options"]
    assert "-e RAY_health_check_period_ms=1000" in options
    assert not any("RAY_health_check_failure_threshold" in o for o in options)  # Ray's 5 misses stay
