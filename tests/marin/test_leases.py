"""Leases and races: exclusive acquisition, heartbeats, stale takeover, owner-only release; ten executors at
once (threads and processes) run each step exactly once; a SIGKILLed executor's step is taken over after
restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, run_experiment
from marin.status.files import read_events
from marin.storage import LocalStorage
from marin.storage.lease import LeaseInfo, LeaseManager
from tests.marin.runner import shared_dag

ROOT = Path(__file__).resolve().parents[2]


def test_only_one_of_many_threads_acquires_a_fresh_lease(tmp_path: Path) -> None:
    storage, path = LocalStorage(), str(tmp_path / "lease.json")
    managers = [LeaseManager(storage, f"owner-{i}", timeout_s=30) for i in range(10)]
    barrier = threading.Barrier(10)
    wins: list[str] = []

    def attempt(m: LeaseManager) -> None:
        barrier.wait()
        if m.try_acquire(path, attempt=1).ok:
            wins.append(m.owner)

    threads = [threading.Thread(target=attempt, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert LeaseInfo.parse(Path(path).read_text()).owner == wins[0]  # type: ignore[union-attr]
    for m in managers:
        m.stop()


def _count_up(path: str, times: int) -> None:
    """Increment the number in `path` `times` times by compare-and-swap, retrying each lost race."""
    storage = LocalStorage()
    done = 0
    while done < times:
        current = storage.read_versioned(path)
        assert current is not None
        if storage.replace_if(path, str(int(current.text) + 1), current.token):
            done += 1


def test_compare_and_swap_across_processes_loses_no_update(tmp_path: Path) -> None:
    """Each swap replaces the file (a new inode) under the lock of the old one; a process that waited on the
    old file's lock must notice and lock the new one, or it would compare against stale text and lose an
    update."""
    import multiprocessing

    path = str(tmp_path / "counter")
    Path(path).write_text("0")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_count_up, args=(path, 150)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 6
    assert Path(path).read_text() == str(6 * 150)
    assert sorted(os.listdir(tmp_path)) == ["counter"]  # no lock files, no temporary files left behind
    storage = LocalStorage()
    assert not storage.replace_if(str(tmp_path / "absent"), "x", "y")
    assert not storage.delete_if(str(tmp_path / "absent"), "y")
    assert storage.delete_if(path, str(6 * 150)) and not Path(path).exists()


def test_stale_lease_is_taken_over_by_exactly_one_and_the_old_owner_cannot_release_it(tmp_path: Path) -> None:
    storage, path = LocalStorage(), str(tmp_path / "lease.json")
    old = LeaseManager(storage, "old", timeout_s=0.2)
    assert old.try_acquire(path, attempt=1).ok
    old.stop()  # the heartbeat stops, as when the executor is killed
    time.sleep(0.35)
    racers = [LeaseManager(storage, f"new-{i}", timeout_s=30) for i in range(8)]
    barrier = threading.Barrier(len(racers))
    outcomes = {}

    def attempt(m: LeaseManager) -> None:
        barrier.wait()
        outcomes[m.owner] = m.try_acquire(path, attempt=2)

    threads = [threading.Thread(target=attempt, args=(m,)) for m in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o, r in outcomes.items() if r.ok]
    assert len(winners) == 1 and outcomes[winners[0]].previous_owner == "old"
    assert not old.release(path)  # old was no longer heartbeating; its release must not delete the new lease
    assert LeaseInfo.parse(Path(path).read_text()).owner == winners[0]  # type: ignore[union-attr]
    # ...and even a manager that still thinks it holds the lease cannot delete the new owner's lease
    assert not storage.delete_if(path, json.dumps({"owner": "old"}))
    assert Path(path).exists()
    for m in racers:
        m.stop()


def test_heartbeat_keeps_a_lease_alive_and_release_deletes_it(tmp_path: Path) -> None:
    storage, path = LocalStorage(), str(tmp_path / "lease.json")
    # Beats every timeout/4 = 0.25 s: going stale needs four beats in a row delayed on a loaded machine.
    owner = LeaseManager(storage, "owner", timeout_s=1.0)
    assert owner.try_acquire(path, attempt=1).ok
    first = LeaseInfo.parse(Path(path).read_text())
    time.sleep(2.5)  # > 2 timeouts: without the heartbeat the lease would be stale
    renewed = LeaseInfo.parse(Path(path).read_text())
    assert renewed and first and renewed.heartbeat > first.heartbeat and not renewed.is_stale(time.time())
    other = LeaseManager(storage, "other", timeout_s=1.0)
    assert not other.try_acquire(path, attempt=1).ok
    assert owner.release(path) and not Path(path).exists()
    owner.stop()
    other.stop()


def test_a_lost_lease_is_reported_and_never_released(tmp_path: Path) -> None:
    storage, path = LocalStorage(), str(tmp_path / "lease.json")
    lost: list[str] = []
    owner = LeaseManager(storage, "owner", timeout_s=30, on_lost=lost.append)
    assert owner.try_acquire(path, attempt=1).ok
    thief = LeaseInfo("thief", time.time(), time.time(), 30, 2).to_json()
    Path(path).write_text(thief)  # someone else's lease now sits there
    owner.renew_all()
    assert lost == [path] and not owner.release(path) and Path(path).read_text() == thief
    owner.stop()


class _ObjectStoreLike(LocalStorage):
    """Local files that behave like an object store for leases (a version token that must be read back after a
    write), with faults: the read-back after the next successful compare-and-swap fails once, and writes to
    the paths in `broken` fail."""

    is_local = False

    def __init__(self) -> None:
        super().__init__()
        self.fail_next_read_back = False
        self.broken: set[str] = set()
        self._just_wrote = False

    def replace_if(self, path: str, text: str, token: object) -> bool:
        if path in self.broken:
            raise TimeoutError(f"PUT {path} timed out")
        done = super().replace_if(path, text, token)
        self._just_wrote = done
        return done

    def read_versioned(self, path: str) -> object:  # type: ignore[override]
        if self._just_wrote and self.fail_next_read_back:
            self._just_wrote = self.fail_next_read_back = False
            raise TimeoutError("the reply was lost")
        self._just_wrote = False
        return super().read_versioned(path)


def test_a_renewal_whose_reply_was_lost_keeps_the_lease(tmp_path: Path) -> None:
    storage, path = _ObjectStoreLike(), str(tmp_path / "lease.json")
    lost: list[str] = []
    owner = LeaseManager(storage, "owner", timeout_s=30, on_lost=lost.append)
    try:
        assert owner.try_acquire(path, attempt=1).ok
        storage.fail_next_read_back = True
        owner.renew_all()  # the write landed, reading its new version back failed: the old token is kept
        # refused on the old token; the lease is still ours, so it is renewed under the new one
        owner.renew_all()
        assert lost == [] and owner.holds(path)
        assert owner.release(path) and not Path(path).exists()
    finally:
        owner.stop()


def test_one_lease_that_cannot_be_renewed_does_not_stop_the_others(tmp_path: Path) -> None:
    storage = _ObjectStoreLike()
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    owner = LeaseManager(storage, "owner", timeout_s=30)
    try:
        assert owner.try_acquire(a, attempt=1).ok and owner.try_acquire(b, attempt=1).ok
        before = LeaseInfo.parse(Path(b).read_text())
        storage.broken.add(a)
        time.sleep(0.01)
        owner.renew_all()  # `a` fails (reported, retried next beat); `b` is still renewed
        after = LeaseInfo.parse(Path(b).read_text())
        assert before and after and after.heartbeat > before.heartbeat
        assert owner.holds(a)  # still ours: a failed renewal is not a lost lease
    finally:
        owner.stop()


def _counts(counter: Path) -> Counter[str]:
    return Counter(Path(line).name.rsplit("-", 1)[0] for line in counter.read_text().split())


def test_ten_executors_in_threads_run_each_step_exactly_once(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    steps = shared_dag(str(tmp_path), sleep_s=0.2)
    barrier = threading.Barrier(10)
    results = []

    def one() -> None:
        barrier.wait()
        results.append(run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"),
                                      verbose=False, script="t/race.py"))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r.status for r in results] == ["SUCCESS"] * 10
    assert _counts(tmp_path / "counter.txt") == {"root": 1, "left": 1, "right": 1, "join": 1}
    reused = sum(1 for r in results for st in r.steps.values() if st.note != "ran")
    assert reused == 10 * 4 - 4


def _runner(kind: str, prefix: str, workdir: Path, lease_timeout: float = 60.0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "tests.marin.runner", kind, prefix, str(workdir),
                             str(lease_timeout)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_ten_executors_in_processes_run_each_step_exactly_once(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    procs = [_runner("shared", prefix, tmp_path) for _ in range(10)]
    outputs = [p.communicate(timeout=180)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, outputs
    assert _counts(tmp_path / "counter.txt") == {"root": 1, "left": 1, "right": 1, "join": 1}


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)


def test_sigkilled_executor_is_taken_over_and_only_its_step_reruns(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    first = _runner("killable", prefix, tmp_path, lease_timeout=1.0)
    _wait_for(tmp_path / "b-started")
    deadline = time.time() + 60
    while not (any("SUCCESS" in p.read_text() for p in Path(prefix, "crash").glob("a-*/.marin/status.json"))
               and any("RUNNING" in p.read_text() for p in Path(prefix,
                                                                "crash").glob("b-*/.marin/status.json"))):
        assert time.time() < deadline, "step a never succeeded or b never recorded RUNNING"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)  # b is mid-step, a has succeeded
    first.wait(30)
    [b_dir] = Path(prefix, "crash").glob("b-*")
    assert json.loads((b_dir / ".marin/status.json").read_text())["status"] == "RUNNING"
    old_owner = json.loads((b_dir / ".marin/lease.json").read_text())["owner"]
    (tmp_path / "b-release").write_text("go\n")  # the restarted attempt may finish
    second = _runner("killable", prefix, tmp_path, lease_timeout=1.0)
    out = second.communicate(timeout=120)[0].decode()
    assert second.returncode == 0, out
    assert _counts(tmp_path / "counter.txt") == {"a": 1, "c": 1}  # a was not re-run; c ran once
    status = json.loads((b_dir / ".marin/status.json").read_text())
    assert status["status"] == "SUCCESS" and status["attempt"] == 2
    events = read_events(LocalStorage(), str(b_dir))
    # issue 32: the lost attempt is closed (PREEMPTED, cause driver_lost) by the executor that took it over
    assert [e["event"] for e in events] == ["RUNNING", "LEASE_TAKEOVER", "PREEMPTED", "RUNNING", "SUCCESS"]
    assert events[1]["previous_owner"] == old_owner
    assert events[2]["cause"] == "driver_lost" and events[2]["attempt"] == 1
    assert not (b_dir / ".marin/lease.json").exists()


@pytest.mark.parametrize("holder_alive", [True, False], ids=["live-lease-waits", "stale-lease-runs"])
def test_plan_reports_wait_or_takeover_for_a_running_step(tmp_path: Path, holder_alive: bool) -> None:
    from marin.graph import build_graph, make_plan
    from marin.status.files import write_status

    prefix = str(tmp_path / "prefix")
    steps = shared_dag(str(tmp_path))
    graph = build_graph(steps)
    root = graph.nodes[0]
    path = root.output_path(prefix)
    storage = LocalStorage()
    write_status(storage, path, name=root.name, hash=root.hash, status="RUNNING", attempt=1, run_id="r",
                 executor="elsewhere:1:abc", previous=None, started=time.time())
    heartbeat = time.time() - (0 if holder_alive else 600)
    storage.write_text(f"{path}/.marin/lease.json",
                       LeaseInfo("elsewhere:1:abc", heartbeat, heartbeat, 60, 1).to_json())
    entry = make_plan(graph, prefix, storage).entries[0]
    if holder_alive:
        assert entry.action == "wait" and "elsewhere:1:abc" in entry.reason
    else:
        assert entry.action == "run" and "stale lease of executor elsewhere:1:abc" in entry.reason


def test_sigterm_records_preempted_releases_the_lease_and_a_restart_reruns(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    first = _runner("killable", prefix, tmp_path, lease_timeout=60)
    _wait_for(tmp_path / "b-started")
    deadline = time.time() + 60
    while not any("RUNNING" in p.read_text() for p in Path(prefix, "crash").glob("b-*/.marin/status.json")):
        assert time.time() < deadline, "b never recorded RUNNING"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGTERM)
    first.wait(60)
    assert first.returncode != 0
    [b_dir] = Path(prefix, "crash").glob("b-*")
    status = json.loads((b_dir / ".marin/status.json").read_text())
    assert status["status"] == "PREEMPTED" and status["error"]["type"] == "Interrupted"
    assert [e["event"] for e in read_events(LocalStorage(), str(b_dir))] == ["RUNNING", "PREEMPTED"]
    assert not (b_dir / ".marin/lease.json").exists()  # released: a restart need not wait for a timeout
    (tmp_path / "b-release").write_text("go\n")
    second = _runner("killable", prefix, tmp_path, lease_timeout=60)
    assert second.wait(120) == 0
    assert json.loads((b_dir / ".marin/status.json").read_text())["attempt"] == 2


def test_a_waiting_executor_reports_the_failure_of_the_one_it_waited_for(tmp_path: Path) -> None:
    from marin import Step, this_output_path
    from tests.marin.fns import BlockConfig, block_until_released

    step = Step(name="w/slow-fail", fn=block_until_released, config=BlockConfig(
        output_path=this_output_path(), started_file=str(tmp_path / "started"),
        release_file=str(tmp_path / "never"), timeout_s=3.0))  # time enough for the second to plan a wait
    prefix = str(tmp_path / "prefix")
    results: dict[str, object] = {}

    def first() -> None:
        results["first"] = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"),
                                          verbose=False, script="t/w.py")

    t = threading.Thread(target=first)
    t.start()
    _wait_for(tmp_path / "started")
    second = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"), verbose=False,
                            script="t/w.py")
    t.join(60)
    assert second.plan.entries[0].action == "wait"
    assert second.status_of("w/slow-fail") == "FAILED"
    state = next(iter(second.steps.values()))
    assert state.error and "failed in executor" in state.error["message"]
    assert "TimeoutError" in state.error["type"]
    assert results["first"].status_of("w/slow-fail") == "FAILED"  # type: ignore[attr-defined]
