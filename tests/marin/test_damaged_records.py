"""Damaged state files in a prefix made by a real tiny run (local backend), corrupted in place: truncated
JSON and binary bytes. Every surface names the file with the fix (`marin plan`, `marin status`, `marin run`,
the dashboard's JSON), and nothing is overwritten or lost: a re-run continues the attempt numbers and keeps
the earlier attempt's log, outputs and the damaged bytes; a damaged manifest is moved aside and rebuilt with
its runs recovered from the steps' own records (status/damaged.py)."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from marin import cli
from marin.dashboard.app import create_app
from marin.status import files as sf
from marin.status import interruptions as il
from marin.storage.fs import storage_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
from marin import Step, executor_main, output_path_of, this_output_path
from tests.marin.fns import SumConfig, WriteConfig, sum_numbers, write_numbers

numbers = Step(name="dmg/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path(), n=5))
total = Step(name="dmg/total", fn=sum_numbers, config=SumConfig(
    input_path=output_path_of(numbers, "numbers.txt"), output_path=this_output_path()))

if __name__ == "__main__":
    executor_main([total], description="damaged records")
"""
DAMAGE = {"truncated": b'{"name": "dmg/total", "hash": "f5', "binary": b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01"}


@pytest.fixture
def ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """(the script, its prefix after one successful run)."""
    monkeypatch.chdir(ROOT)
    script = tmp_path / "dmg_exp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    prefix = tmp_path / "prefix"
    assert _marin("run", script, prefix) == 0
    yield script, prefix


def _marin(command: str, script: Path | None, prefix: Path, *flags: str) -> int:
    args = [command, *([str(script)] if script else []), "--prefix", str(prefix), *flags]
    if command == "run":
        args += ["--backend", "local"]
    return cli.main(args)


def _step_dir(prefix: Path, name: str) -> Path:
    [found] = Path(prefix, "dmg").glob(f"{name}-*")
    return found


def _client(prefix: Path) -> TestClient:
    return TestClient(create_app(str(prefix), cache_ttl=0))


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_an_unreadable_status_is_named_everywhere_and_a_rerun_keeps_every_earlier_attempt(
    ran: tuple[Path, Path], damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script, prefix = ran
    total = _step_dir(prefix, "total")
    status_file = total / ".marin/status.json"
    log_1 = (total / ".marin/logs/attempt-1.log").read_bytes()
    result_1 = (total / "total.txt").read_bytes()
    status_file.write_bytes(DAMAGE[damage])
    capsys.readouterr()

    assert _marin("plan", script, prefix) == 0
    plan = capsys.readouterr().out
    assert f"warning: {status_file} cannot be read" in plan and "Fix:" in plan
    assert "status.json cannot be read: run again as a new attempt" in plan

    assert _marin("status", script, prefix) == 0
    status = capsys.readouterr().out
    assert "UNREADABLE dmg/total" in status and "NOT RUN" not in status
    assert f"{status_file} cannot be read" in status

    with _client(prefix) as client:
        [experiment] = client.get("/api/experiments").json()["items"]
        detail = client.get(f"/api/experiments/{experiment['id']}")
        assert detail.status_code == 200
        by_name = {s["name"]: s for s in detail.json()["steps"]}
        assert by_name["dmg/total"]["status"] == "UNREADABLE"
        assert str(status_file) in by_name["dmg/total"]["error"]["message"]
        assert any(str(status_file) in p for p in detail.json()["problems"])
        step = client.get(f"/api/steps/{total.relative_to(prefix)}")
        assert step.status_code == 200 and step.json()["status"]["status"] == "UNREADABLE"
        assert any(str(status_file) in p and "Fix:" in p for p in step.json()["problems"])
        assert client.get(f"/experiments/{experiment['id']}").status_code == 200
        assert client.get(f"/steps/{total.relative_to(prefix)}").status_code == 200

    assert _marin("run", script, prefix) == 0
    err = capsys.readouterr().err
    assert f"status.json could not be read; moved to {status_file}.corrupt-" in err
    [aside] = total.glob(".marin/status.json.corrupt-*")
    assert aside.read_bytes() == DAMAGE[damage]  # the damaged bytes themselves are kept
    assert (total / ".marin/logs/attempt-1.log").read_bytes() == log_1  # never overwritten
    assert (total / ".marin/earlier-1/total.txt").read_bytes() == result_1
    new = json.loads(status_file.read_text())
    assert new["status"] == "SUCCESS" and new["attempt"] == 2 and new["log"] == "logs/attempt-2.log"
    events = sf.read_events(storage_for(str(total)), str(total))
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("RUNNING", 1), ("SUCCESS", 1), ("DAMAGED_RECORD", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert events[2]["moved_to"] == str(aside)
    assert events[2]["outputs_kept"] == str(total / ".marin/earlier-1")


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_manifest_is_named_moved_aside_and_rebuilt_with_its_runs(
    ran: tuple[Path, Path], damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script, prefix = ran
    [manifest] = Path(prefix, "experiments").glob("*.json")
    first_run = json.loads(manifest.read_text())["runs"][0]["run_id"]
    manifest.write_bytes(DAMAGE[damage])
    capsys.readouterr()

    assert _marin("status", None, prefix) == 0
    assert f"warning: {manifest} cannot be read" in capsys.readouterr().err
    with _client(prefix) as client:
        listed = client.get("/api/experiments").json()
        assert any(f"experiments/{manifest.name} cannot be read" in p for p in listed["problems"])
        one = client.get(f"/api/experiments/{manifest.stem}")
        assert one.status_code == 422
        assert f"experiments/{manifest.name} cannot be read" in one.json()["detail"]
        assert client.get("/").status_code == 200

    assert _marin("run", script, prefix) == 0
    err = capsys.readouterr().err
    assert f"{manifest} cannot be read" in err and "rebuilt from the steps' own records" in err
    [aside] = Path(prefix, "experiments").glob("*.json.corrupt-*")
    assert aside.read_bytes() == DAMAGE[damage]
    rebuilt = json.loads(manifest.read_text())
    assert [r["run_id"] for r in rebuilt["runs"]][0] == first_run  # the earlier run is recovered
    assert rebuilt["runs"][0]["recovered"] and rebuilt["runs"][0]["status"] == "SUCCESS"
    assert rebuilt["runs"][-1]["status"] == "SUCCESS" and len(rebuilt["runs"]) == 2
    assert rebuilt["rebuilt"][0]["moved_to"] == str(aside) and rebuilt["rebuilt"][0]["runs_recovered"] == 1
    assert {s["name"] for s in rebuilt["steps"]} == {"dmg/numbers", "dmg/total"}


def test_binary_and_cut_lines_in_events_are_skipped_and_counted(ran: tuple[Path, Path]) -> None:
    _, prefix = ran
    total = _step_dir(prefix, "total")
    events_file = total / ".marin/events.jsonl"
    with events_file.open("ab") as f:
        f.write(b"\xff\xfe\x00binary\n")
        f.write(b'{"ts": 1, "event": "RUN')  # cut by a crash
    events, skipped = sf.read_events_counted(storage_for(str(total)), str(total))
    assert [e["event"] for e in events] == ["RUNNING", "SUCCESS"] and skipped == 2
    with _client(prefix) as client:
        step = client.get(f"/api/steps/{total.relative_to(prefix)}")
        assert step.status_code == 200
        assert [e["event"] for e in step.json()["events"]] == ["RUNNING", "SUCCESS"]
        assert any(f"{events_file.relative_to(prefix)}: 2 line(s) skipped" in p or
                   f"{events_file}: 2 line(s) skipped" in p for p in step.json()["problems"])


def test_a_damaged_ledger_is_moved_aside_before_a_new_entry_is_written(tmp_path: Path) -> None:
    out = tmp_path / "step-12345678"
    (out / ".marin").mkdir(parents=True)
    (out / ".marin/interruptions.json").write_bytes(b'{"interruptions": [{"attempt": 1, "cau')
    storage = storage_for(str(out))
    il.record_interruption(storage, str(out), name="step", attempt=2, run_id="r", cause="preempted", hosts=[],
                           started=1.0, ended=2.0)
    [aside] = out.glob(".marin/interruptions.json.corrupt-*")
    assert aside.read_bytes() == b'{"interruptions": [{"attempt": 1, "cau'
    ledger = json.loads((out / ".marin/interruptions.json").read_text())
    assert [e["attempt"] for e in ledger["interruptions"]] == [2]
    assert ledger["damaged"][0]["moved_to"] == str(aside)


def test_a_damaged_step_json_is_named_by_the_plan_and_kept_when_the_step_runs_again(
    ran: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    script, prefix = ran
    total = _step_dir(prefix, "total")
    step_json = total / ".marin/step.json"
    step_json.write_bytes(DAMAGE["binary"])
    capsys.readouterr()
    assert _marin("plan", script, prefix) == 0  # the step is reused; its step.json is named with the fix
    plan = capsys.readouterr().out
    assert f"warning: {step_json} cannot be read" in plan and "Fix:" in plan
    (total / ".marin/status.json").write_bytes(DAMAGE["truncated"])  # now it runs again
    assert _marin("run", script, prefix) == 0  # (the worker's warning goes to its own stderr)
    [aside] = total.glob(".marin/step.json.corrupt-*")
    assert aside.read_bytes() == DAMAGE["binary"]
    assert json.loads(step_json.read_text())["name"] == "dmg/total"
    # with status.json damaged too, step.json is still named (stderr and a DAMAGED_RECORD event), once
    err = capsys.readouterr().err
    assert f"warning: {step_json} cannot be read" in err
    assert f"marin: step dmg/total: step.json could not be read; moved to {aside}" in err
    events = sf.read_events(storage_for(str(total)), str(total))
    named = [e for e in events if e["event"] == "DAMAGED_RECORD" and e.get("path") == str(step_json)]
    assert len(named) == 1 and named[0]["moved_to"] == str(aside)
    status_file = str(total / ".marin/status.json")
    assert [e for e in events if e["event"] == "DAMAGED_RECORD" and e.get("path") == status_file]


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_step_json_alone_is_named_and_moved_aside_never_silently_rewritten(
    ran: tuple[Path, Path], damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """status.json is fine, step.json is damaged: `marin plan` and `marin status` name it with the fix; a
    forced re-run names it on stderr, moves it aside (`*.corrupt-<time>`, the bytes kept) and records a
    DAMAGED_RECORD event before the new attempt writes a fresh step.json; no earlier log is overwritten."""
    script, prefix = ran
    total = _step_dir(prefix, "total")
    step_json = total / ".marin/step.json"
    step_json.write_bytes(DAMAGE[damage])
    log_1 = (total / ".marin/logs/attempt-1.log").read_bytes()
    capsys.readouterr()
    assert _marin("plan", script, prefix, "--force-run", "dmg/total") == 0
    plan = capsys.readouterr().out
    assert f"warning: {step_json} cannot be read" in plan and "Fix:" in plan
    assert "this run moves it aside before it writes a new one" in plan
    assert _marin("status", script, prefix) == 0
    status = capsys.readouterr().out
    assert "SUCCESS    dmg/total" in status and f"{step_json} cannot be read" in status
    assert step_json.read_bytes() == DAMAGE[damage]  # plan and status only name it

    assert _marin("run", script, prefix, "--force-run", "dmg/total") == 0
    err = capsys.readouterr().err
    [aside] = total.glob(".marin/step.json.corrupt-*")
    assert f"warning: {step_json} cannot be read" in err and f"moved to {aside}" in err
    assert aside.read_bytes() == DAMAGE[damage]
    assert json.loads(step_json.read_text())["name"] == "dmg/total"
    assert (total / ".marin/logs/attempt-1.log").read_bytes() == log_1
    events = sf.read_events(storage_for(str(total)), str(total))
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("RUNNING", 1), ("SUCCESS", 1), ("DAMAGED_RECORD", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert events[2]["path"] == str(step_json) and events[2]["moved_to"] == str(aside)
    assert json.loads((total / ".marin/status.json").read_text())["attempt"] == 2


def test_a_step_with_an_unreadable_status_whose_dependency_fails_is_left_untouched(
    ran: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """dmg/total's status.json is damaged and its dependency fails in this run: no lease is taken and no
    DEP_FAILED is written over the damaged file (as "attempt 0" it would lose the attempts on record and the
    next run would write attempt 1's log again). Once the dependency succeeds, total runs as attempt 2 and
    attempt 1's log is kept."""
    script, prefix = ran
    numbers, total = _step_dir(prefix, "numbers"), _step_dir(prefix, "total")
    status_file = total / ".marin/status.json"
    status_file.write_bytes(DAMAGE["truncated"])
    events_before = (total / ".marin/events.jsonl").read_bytes()
    log_1 = (total / ".marin/logs/attempt-1.log").read_bytes()
    (numbers / "numbers.txt").unlink()
    (numbers / "numbers.txt").mkdir()  # writing it fails: the dependency's forced re-run fails
    assert _marin("run", script, prefix, "--force-run", "dmg/numbers") != 0
    assert status_file.read_bytes() == DAMAGE["truncated"]  # left as it is
    assert (total / ".marin/events.jsonl").read_bytes() == events_before
    assert not (total / ".marin/lease.json").exists() and not list(total.glob(".marin/*.corrupt-*"))
    capsys.readouterr()
    assert _marin("status", script, prefix) == 0
    assert "UNREADABLE dmg/total" in capsys.readouterr().out  # still named
    assert _marin("run", script, prefix) != 0  # numbers failed before: total is blocked, and named
    shown = capsys.readouterr()
    out = shown.out + shown.err
    assert "dependency dmg/numbers failed previously" in out and f"{status_file} cannot be read" in out
    assert "None dmg/total" not in out  # it used to stay planned to run, never started, status None
    assert status_file.read_bytes() == DAMAGE["truncated"]

    (numbers / "numbers.txt").rmdir()
    assert _marin("run", script, prefix, "--force-run-failed") == 0
    assert json.loads(status_file.read_text())["attempt"] == 2
    assert (total / ".marin/logs/attempt-1.log").read_bytes() == log_1


def test_on_an_object_store_a_damaged_manifest_is_moved_aside_and_binary_event_lines_are_counted(
    s3_bucket: str,
) -> None:
    from marin.status import manifest

    prefix = f"{s3_bucket}/damaged-{time.time_ns()}"
    storage = storage_for(prefix)
    out = f"{prefix}/dmg/total-12345678"
    storage.append_text(sf.events_path(out), json.dumps({"ts": 5.0, "event": "RUNNING", "attempt": 1,
                                                         "run_id": "old", "executor": "e"}) + "\n")
    storage.fs.pipe_file(sf.events_path(out), storage.read_bytes(sf.events_path(out)) + b"\xff\xfe\n")
    assert sf.read_events_counted(storage, out)[1] == 1
    path = manifest.manifest_path(prefix, "dmg-12345678")
    storage.fs.pipe_file(path, DAMAGE["binary"])
    manifest.start_run(storage, prefix, "dmg-12345678", script="s.py", description="", issue=None,
                       provenance={}, steps=[{"name": "dmg/total", "hash": "h", "output_path": out}],
                       run_id="new", args=[])
    [aside] = [p for p in storage.listdir(f"{prefix}/experiments") or [] if ".corrupt-" in p]
    assert storage.read_bytes(f"{prefix}/experiments/{aside}") == DAMAGE["binary"]
    rebuilt = json.loads(storage.read_text(path) or "")
    assert [(r["run_id"], r["status"]) for r in rebuilt["runs"]] == [("old", "UNKNOWN"), ("new", "RUNNING")]


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_verdicts_file_is_one_problem_row_never_a_500(ran: tuple[Path, Path], damage: str) -> None:
    _, prefix = ran
    [manifest] = Path(prefix, "experiments").glob("*.json")
    experiment = manifest.stem
    verdicts = Path(prefix, "experiments", experiment, "verdicts.json")
    verdicts.parent.mkdir(parents=True, exist_ok=True)
    verdicts.write_bytes(DAMAGE[damage])
    client = _client(prefix)
    for url in ("/", "/api/experiments", f"/experiments/{experiment}"):
        assert client.get(url).status_code == 200, url
    detail = client.get(f"/api/experiments/{experiment}").json()
    assert detail["verdict"] is None
    assert any(str(verdicts) in p and "Fix:" in p for p in detail["problems"]), detail["problems"]
    assert verdicts.read_bytes() == DAMAGE[damage]  # shown, never rewritten by a reader


def test_a_damaged_manifest_or_verdicts_file_never_unfreezes_a_judged_hypothesis(tmp_path: Path) -> None:
    from marin.status import manifest, verdicts

    storage, prefix = storage_for(str(tmp_path)), str(tmp_path)
    first = {"hypothesis": "A beats B", "criteria": [], "tags": [], "sha256": "aaa"}
    other = {"hypothesis": "B beats A", "criteria": [], "tags": [], "sha256": "bbb"}
    common = dict(script="s.py", description="", issue=None, provenance={}, steps=[], args=[])
    manifest.start_run(storage, prefix, "e-1", run_id="r1", notebook=first, amendable=True, **common)
    record = Path(manifest.manifest_path(prefix, "e-1"))
    record.write_bytes(DAMAGE["truncated"])  # torn, after a verdict was recorded
    with pytest.raises(manifest.NotebookFrozenError, match="moved aside"):
        manifest.start_run(storage, prefix, "e-1", run_id="r2", notebook=other, amendable=False, judged=True,
                           **common)
    with pytest.raises(manifest.NotebookFrozenError, match="has a recorded verdict"):  # and again, file gone
        manifest.start_run(storage, prefix, "e-1", run_id="r3", notebook=other, amendable=False, judged=True,
                           **common)
    assert list(record.parent.glob("e-1.json.corrupt-*"))  # the damaged manifest is kept aside
    damaged_verdicts = Path(verdicts.verdicts_path(prefix, "e-1"))
    damaged_verdicts.parent.mkdir(parents=True, exist_ok=True)
    damaged_verdicts.write_bytes(DAMAGE["binary"])
    assert verdicts.amendable(storage, prefix, "e-1") is False  # unreadable counts as judged
    damaged_verdicts.unlink()
    assert verdicts.amendable(storage, prefix, "e-1") is True


@pytest.mark.parametrize("where", ["local", "s3"])
def test_keep_outputs_copies_the_files_and_leaves_directories_in_place(
        where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """What a re-run of a recorded step does first (status/damaged.py `keep_outputs`), on local disk and on an
    object store: every file at the top of the output path is copied, byte for byte, to .marin/earlier-N/;
    the originals stay (a resuming step appends to them), and so do directories (checkpoints); a second
    keep for the same attempt gets its own directory."""
    from marin.status import damaged

    root = (f"{request.getfixturevalue('s3_bucket')}/keep-{time.time_ns()}" if where == "s3"
            else str(tmp_path))
    storage = storage_for(root)
    out = f"{root}/train/tiny-12345678"
    files = {"train_result.json": b'{"tokens_per_s": 812.5}', "metrics.jsonl": b'{"step": 1}\n\xff\n'}
    for name, data in files.items():
        if where == "s3":
            storage.fs.pipe_file(f"{out}/{name}", data)
        else:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, name).write_bytes(data)
    storage.write_text(f"{out}/checkpoints/6/state.json", "{}")
    storage.write_text(sf.status_path(out), "{}")

    kept = damaged.keep_outputs(storage, out, 1)
    assert kept == f"{out}/.marin/earlier-1"
    assert sorted(storage.listdir(kept) or []) == sorted(files)
    for name, data in files.items():
        assert storage.read_bytes(f"{kept}/{name}") == data == storage.read_bytes(f"{out}/{name}")
    assert storage.read_text(f"{out}/checkpoints/6/state.json") == "{}"  # left where it was
    assert damaged.keep_outputs(storage, out, 1) == f"{out}/.marin/earlier-1.2"


def test_parse_lenient_names_a_damaged_record_through_its_callback_and_reads_a_good_one() -> None:
    from marin.status import damaged

    assert damaged.parse_lenient("/p/.marin/status.json", b'{"status": "SUCCESS"}') == {"status": "SUCCESS"}
    assert damaged.parse_lenient("/p/.marin/status.json", None) is None  # absent
    assert damaged.parse_lenient("/p/.marin/status.json", DAMAGE["truncated"]) is None
    named = damaged.parse_lenient("/p/.marin/step.json", DAMAGE["binary"], str)
    assert isinstance(named, str) and "/p/.marin/step.json cannot be read" in named and "Fix:" in named
    assert "not an object" in str(damaged.parse_lenient("/p/.marin/step.json", b"[1]", str))
