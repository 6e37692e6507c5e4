"""The local backend hands out this machine's resources the way Ray hands out a node's: attempts whose
requests do not fit together run one after another, attempts that fit run at once, and a request larger than
the machine is an error naming the step before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin import (
    ExecutorMainConfig,
    InfeasibleResourcesError,
    Resources,
    Step,
    run_experiment,
    this_output_path,
)
from marin.execution import local_backend
from marin.execution.resources import local_machine
from tests.marin.fns import ExclusiveConfig, NoopConfig, RendezvousConfig, exclusive, noop, rendezvous


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 2 CPUs, 64 GiB and no GPU, whatever this one has."""
    monkeypatch.setattr(local_backend, "local_machine", lambda: {"CPU": 2.0, "memory": float(64 * 2**30)})


def _run(steps: list[Step], tmp_path: Path) -> object:
    return run_experiment(steps,
                          ExecutorMainConfig(prefix=str(tmp_path / "out"), backend="local", max_concurrent=4),
                          verbose=False, script="resources.py")


def test_steps_that_need_the_whole_machine_run_one_after_another(two_cpus: None, tmp_path: Path) -> None:
    markers = str(tmp_path / "running")
    steps = [Step(name=f"res/big{i}", fn=exclusive, resources=Resources(num_cpus=2),
                  config=ExclusiveConfig(output_path=this_output_path(),
                                         markers_dir=markers)) for i in range(3)]
    result = _run(steps, tmp_path)
    assert result.status == "SUCCESS", result.summary  # type: ignore[attr-defined]


def test_the_check_sees_steps_that_overlap(two_cpus: None, tmp_path: Path) -> None:
    """Negative control for the test above: the same steps at one CPU each do run at the same time."""
    markers = str(tmp_path / "running")
    steps = [Step(name=f"res/small{i}", fn=exclusive, resources=Resources(num_cpus=1),
                  # held until the other one arrives (then both fail at once), however late it starts
                  config=ExclusiveConfig(output_path=this_output_path(), markers_dir=markers, hold_s=60.0))
             for i in range(2)]
    result = _run(steps, tmp_path)
    assert result.status == "FAILED"  # type: ignore[attr-defined]
    assert "ran at the same time" in result.summary  # type: ignore[attr-defined]


def test_steps_that_fit_together_run_at_once(two_cpus: None, tmp_path: Path) -> None:
    files = [str(tmp_path / f"arrived-{i}") for i in range(2)]
    steps = [Step(name=f"res/meet{i}", fn=rendezvous, resources=Resources(num_cpus=1),
                  config=RendezvousConfig(output_path=this_output_path(), arrive_file=files[i],
                                          others=tuple(f for f in files if f != files[i])))
             for i in range(2)]
    result = _run(steps, tmp_path)
    assert result.status == "SUCCESS", result.summary  # type: ignore[attr-defined]


def test_a_request_larger_than_the_machine_fails_before_anything_runs(two_cpus: None, tmp_path: Path) -> None:
    gpu = Step(name="res/gpu", fn=noop, resources=Resources(num_gpus=1),
               config=NoopConfig(this_output_path()))
    tpu = Step(name="res/tpu", fn=noop, resources={"resources": {"TPU": 4}},
               config=NoopConfig(this_output_path()))
    fits = Step(name="res/fits", fn=noop, resources=Resources(num_cpus=2),
                config=NoopConfig(this_output_path()))
    with pytest.raises(InfeasibleResourcesError) as info:
        _run([gpu, tpu, fits], tmp_path)
    message = str(info.value)
    assert "step res/gpu requests GPU=1 (largest node has 0)" in message
    assert "step res/tpu requests TPU=4 (largest node has 0)" in message
    assert "res/fits" not in message and "MARIN_LOCAL_RESOURCES" in message
    assert not list((tmp_path / "out").glob("res/*"))  # nothing ran, no status was written


def test_custom_resources_are_declared_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_LOCAL_RESOURCES", '{"TPU": 4}')
    assert local_machine()["TPU"] == 4.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert local_machine()["GPU"] == 2.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "GPU" not in local_machine()
    monkeypatch.setenv("MARIN_LOCAL_RESOURCES", "TPU=4")
    with pytest.raises(InfeasibleResourcesError, match="MARIN_LOCAL_RESOURCES='TPU=4' is not valid"):
        local_machine()


def test_workers_are_forked_only_by_the_executors_thread(two_cpus: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash retires its worker; the attempt waiting for the machine then needs a new one. The reaper thread
    that saw the crash must not fork it (a fork copies only the forking thread, and locks other threads hold
    stay held in the child): it hands the start to the executor's thread."""
    import threading

    from tests.marin.fns import DieConfig, die

    forked_on: list[str] = []
    spawn = local_backend.LocalBackend._spawn

    def recording_spawn(self: local_backend.LocalBackend) -> local_backend._Worker:
        forked_on.append(threading.current_thread().name)
        return spawn(self)

    monkeypatch.setattr(local_backend.LocalBackend, "_spawn", recording_spawn)
    crash = Step(name="res/crash", fn=die, resources=Resources(num_cpus=2), retries=0,
                 config=DieConfig(output_path=this_output_path(), how="exit"))
    after = Step(name="res/after", fn=noop, resources=Resources(num_cpus=2),
                 config=NoopConfig(output_path=this_output_path()))
    result = _run([crash, after], tmp_path)
    assert result.status_of("res/crash") == "FAILED" and result.status_of("res/after") == "SUCCESS"  # type: ignore[attr-defined]
    # the first worker, and the crashed one's replacement
    assert forked_on == [threading.main_thread().name] * 2
