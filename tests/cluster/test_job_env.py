"""The sealed job environment (marin/cluster/job_env.py) without a cluster: what Ray would store for it."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
from ray._private.runtime_env.packaging import get_uri_for_directory

from marin.cluster.job_env import MODULE_ENV_VAR, apply_job_env, seal


def test_two_jobs_sealed_with_the_same_secrets_get_their_own_stored_package(tmp_path: Path) -> None:
    # Ray stores a py_module under a hash of its files, not of its directory name: equal contents under two
    # names shared one zip, and the second job's driver could not find its own package name (seen when the
    # same experiment was submitted twice)
    first, second = seal({"GITHUB_TOKEN": "t0k"}, tmp_path), seal({"GITHUB_TOKEN": "t0k"}, tmp_path)
    assert first is not None and second is not None and first.name != second.name
    uris = {get_uri_for_directory(str(p), include_gitignore=True) for p in (first, second)}
    assert len(uris) == 2


def test_a_driver_loads_its_sealed_variables_without_overriding_set_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = seal({"GITHUB_TOKEN": "sealed-t0ken-9f2", "WANDB_API_KEY": "wandb-k3y-77"}, tmp_path)
    assert package is not None
    assert (package / "env.json").stat().st_mode & 0o077 == 0  # only the owner can read the secrets
    assert json.loads((package / "env.json").read_text())["GITHUB_TOKEN"] == "sealed-t0ken-9f2"
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setenv(MODULE_ENV_VAR, package.name)
    monkeypatch.setenv("GITHUB_TOKEN", "already-set")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert apply_job_env() == ["GITHUB_TOKEN", "WANDB_API_KEY"]
    assert os.environ["GITHUB_TOKEN"] == "already-set" and os.environ["WANDB_API_KEY"] == "wandb-k3y-77"
    sys.modules.pop(package.name, None)


def test_a_driver_without_its_package_is_told_to_resubmit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODULE_ENV_VAR, "marin_job_env_0000000000000000")
    with pytest.raises(RuntimeError, match="resubmit with `marin submit`"):
        apply_job_env()
