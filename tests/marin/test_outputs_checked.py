"""Outputs checked before reuse (issue 35): a step's output manifest, written at SUCCESS, is compared with one
listing by every plan; a missing or changed output re-runs the step with the reason in the plan, and
`marin verify` re-reads every byte. On local disk, moto's S3 server and fake-gcs-server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, Step, output_path_of, run_experiment, this_output_path
from marin.status import verify
from marin.status.files import read_status
from marin.storage.fs import storage_for
from marin.storage.outputs import INLINE_ENTRIES, manifest_path, read_manifest
from tests.marin.fns import (
    FsCopyConfig,
    FsWriteConfig,
    ShardsConfig,
    SumConfig,
    WriteConfig,
    fs_copy_upper,
    fs_write,
    sum_numbers,
    write_numbers,
    write_shards,
    write_with_outside_log,
)


def _steps() -> tuple[Step, Step]:
    numbers = Step(name="out/numbers", fn=write_numbers, config=WriteConfig(output_path=this_output_path()))
    total = Step(name="out/total", fn=sum_numbers, config=SumConfig(
        input_path=output_path_of(numbers, "numbers.txt"), output_path=this_output_path()))
    return numbers, total


def _run(steps: list[Step], prefix: str, dry: bool = False):  # type: ignore[no-untyped-def]
    return run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local", dry_run=dry),
                          verbose=False, script="tests/outputs.py")


def _actions(result) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(e.action, e.reason) for e in result.plan.entries]


def test_the_manifest_is_written_with_success_and_names_every_output(tmp_path: Path) -> None:
    numbers, total = _steps()
    result = _run([total], str(tmp_path))
    out = result.output_path("out/total")
    status = json.loads(Path(out, ".marin/status.json").read_text())
    manifest = read_manifest(storage_for(out), out, status["outputs"])
    assert manifest is not None
    assert sorted(manifest["entries"]) == ["total.txt"]
    text = Path(out, "total.txt").read_bytes()
    import hashlib

    assert manifest["entries"]["total.txt"] == {"size": len(text),
                                                "checksum": "sha256:" + hashlib.sha256(text).hexdigest(),
                                                "version": os.stat(Path(out, "total.txt")).st_mtime_ns}
    # one file: the manifest goes inside the SUCCESS status (one write), no outputs.json beside it
    assert status["outputs"] == {"files": 1, "bytes": manifest["bytes"], "listing": manifest["listing"],
                                 "entries": manifest["entries"]}
    assert not Path(manifest_path(out)).exists()


def test_a_step_of_many_files_writes_its_manifest_to_a_file_and_a_changed_one_is_still_named(
        tmp_path: Path) -> None:
    """Past INLINE_ENTRIES files the manifest is `.marin/outputs.json` (written before SUCCESS) and the status
    keeps the summary only; a file changed since is named from it. Run again with few files, the step
    rewrites that file rather than leave a stale manifest beside an inline one."""
    step = Step(name="out/shards", fn=write_shards,
                config=ShardsConfig(output_path=this_output_path(), files=INLINE_ENTRIES + 4))
    out = _run([step], str(tmp_path)).output_path("out/shards")
    status = json.loads(Path(out, ".marin/status.json").read_text())
    manifest = json.loads(Path(manifest_path(out)).read_text())
    assert len(manifest["entries"]) == INLINE_ENTRIES + 4 == status["outputs"]["files"]
    assert status["outputs"] == {"files": INLINE_ENTRIES + 4, "bytes": manifest["bytes"],
                                 "listing": manifest["listing"]}
    assert read_manifest(storage_for(out), out, status["outputs"]) == manifest
    Path(out, "shard-03.txt").write_text("shard 3 changed\n")
    assert _actions(_run([step], str(tmp_path), dry=True)) == [
        ("run", "outputs changed since success: 1 file changed (shard-03.txt); re-running")]
    os.unlink(manifest_path(out))  # a manifest file gone: nothing to name the change from
    assert _actions(_run([step], str(tmp_path), dry=True)) == [
        ("run", "outputs cannot be checked since success: its output manifest (.marin/outputs.json) is gone; "
                "re-running")]
    again = _run([step], str(tmp_path))
    assert again.status == "SUCCESS" and _actions(_run([step], str(tmp_path), dry=True)) == [
        ("skip", "already succeeded (attempt 2)")]
    assert Path(out, "shard-03.txt").read_text() == "shard 3\n"  # written again by the re-run
    assert json.loads(Path(manifest_path(out)).read_text())["entries"]["shard-03.txt"]["size"] == 8


def test_a_step_run_again_over_an_outputs_json_of_an_earlier_success_rewrites_it(tmp_path: Path) -> None:
    """A step recorded by an engine that always wrote outputs.json, run again (here `--force-run`): its one
    file would go inline, but the listing shows the old outputs.json, so the new manifest is written there;
    no stale manifest is left beside the status."""
    numbers, total = _steps()
    out = _run([total], str(tmp_path)).output_path("out/total")
    Path(manifest_path(out)).write_text('{"schema": "marin-outputs/v1", "entries": {"old.txt": {"size": 1}}}')
    forced = run_experiment([total], ExecutorMainConfig(prefix=str(tmp_path), backend="local",
                                                        force_run=["out/total"]),
                            verbose=False, script="tests/outputs.py")
    assert forced.status == "SUCCESS"
    status = json.loads(Path(out, ".marin/status.json").read_text())
    manifest = json.loads(Path(manifest_path(out)).read_text())
    assert list(manifest["entries"]) == ["total.txt"] and "entries" not in status["outputs"]
    assert status["outputs"]["listing"] == manifest["listing"]


def test_a_deleted_output_re_runs_its_step_and_the_plan_says_why(tmp_path: Path) -> None:
    numbers, total = _steps()
    first = _run([total], str(tmp_path))
    os.unlink(Path(first.output_path("out/total"), "total.txt"))
    plan = _run([total], str(tmp_path), dry=True)
    assert _actions(plan) == [
        ("skip", "already succeeded (attempt 1)"),
        ("run", "outputs changed since success: 1 file missing (total.txt); re-running")]
    again = _run([total], str(tmp_path))
    assert again.status == "SUCCESS" and [e.action for e in again.plan.entries] == ["skip", "run"]
    assert Path(first.output_path("out/total"), "total.txt").read_text() == "45\n"
    assert [e.action for e in _run([total], str(tmp_path), dry=True).plan.entries] == ["skip", "skip"]


def test_a_re_run_waiting_on_another_executors_lease_never_takes_the_damaged_success(tmp_path: Path) -> None:
    import threading
    import time

    numbers, total = _steps()
    out = _run([total], str(tmp_path)).output_path("out/total")
    os.unlink(Path(out, "total.txt"))
    lease, stop = Path(out, ".marin/lease.json"), threading.Event()

    def hold() -> None:  # another executor holds the lease; its attempt has not started (the old SUCCESS)
        while not stop.wait(0.2):
            now = time.time()
            lease.write_text(json.dumps({"owner": "other-exec", "acquired": now - 1, "heartbeat": now,
                                         "timeout_s": 60, "attempt": 2}))
        lease.unlink()  # ... and then lets it go without writing anything

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    time.sleep(0.5)
    threading.Timer(3.0, stop.set).start()
    again = _run([total], str(tmp_path))
    holder.join()
    assert again.status == "SUCCESS" and Path(out, "total.txt").read_text() == "45\n"  # re-run, not reused


def test_changed_bytes_re_run_but_a_touched_file_with_the_same_bytes_does_not(tmp_path: Path) -> None:
    numbers, total = _steps()
    first = _run([numbers], str(tmp_path))
    path = Path(first.output_path("out/numbers"), "numbers.txt")
    os.utime(path, ns=(1, 1))  # same bytes, another mtime: the digest is re-read and still matches
    assert [e.action for e in _run([numbers], str(tmp_path), dry=True).plan.entries] == ["skip"]
    path.write_text(path.read_text().replace("9", "8"))  # same size, other bytes
    assert _actions(_run([numbers], str(tmp_path), dry=True)) == [
        ("run", "outputs changed since success: 1 file changed (numbers.txt); re-running")]


def test_an_intermediate_step_whose_outputs_changed_is_named_even_when_not_needed(tmp_path: Path) -> None:
    numbers, total = _steps()
    first = _run([total], str(tmp_path))
    os.unlink(Path(first.output_path("out/numbers"), "numbers.txt"))
    entry = _run([total], str(tmp_path), dry=True).plan.entries[0]
    assert entry.action == "skip" and entry.warnings == [
        "outputs changed since success: 1 file missing (numbers.txt) (not re-run: nothing that needs it will "
        "run)"]


def test_an_added_file_is_reported_and_reused(tmp_path: Path) -> None:
    numbers, _ = _steps()
    first = _run([numbers], str(tmp_path))
    Path(first.output_path("out/numbers"), "notes.txt").write_text("mine\n")
    entry = _run([numbers], str(tmp_path), dry=True).plan.entries[0]
    assert entry.action == "skip"
    assert entry.warnings == ["outputs changed since success: 1 file added (notes.txt) (reused: added files "
                              "are "
                              "not a reason to re-run)"]


def test_steps_recorded_before_manifests_are_trusted_and_the_plan_says_so_once(tmp_path: Path) -> None:
    numbers, total = _steps()
    first = _run([total], str(tmp_path))
    for name in ("out/numbers", "out/total"):  # what a run before issue 35 left
        status = Path(first.output_path(name), ".marin/status.json")
        old = json.loads(status.read_text())
        del old["outputs"]
        status.write_text(json.dumps(old))
        Path(manifest_path(first.output_path(name))).unlink(missing_ok=True)  # inline: in the status
    os.unlink(Path(first.output_path("out/total"), "total.txt"))  # not noticed: nothing to compare with
    plan = _run([total], str(tmp_path), dry=True)
    assert [e.action for e in plan.plan.entries] == ["skip", "skip"]
    assert [w for w in plan.plan.warnings if "output manifests" in w] == [
        "2 succeeded step(s) were recorded before output manifests: their outputs are trusted without a "
        "check (their next run records one)"]


def test_verify_re_reads_every_byte_and_fails_on_a_mismatch(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    numbers, total = _steps()
    first = _run([total], str(tmp_path))
    assert verify.main([str(tmp_path)]) == 0
    assert "ok: 2" in capsys.readouterr().out
    path = Path(first.output_path("out/numbers"), "numbers.txt")
    stat = path.stat()
    path.write_text(path.read_text().replace("1", "7"))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime: only a re-read sees it
    assert [e.action for e in _run([total], str(tmp_path), dry=True).plan.entries] == ["skip", "skip"]
    assert verify.main(["tests/outputs.py", "--prefix", str(tmp_path), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["result"], s["detail"]) for s in report["steps"]] == [
        ("out/numbers", "differs", "outputs changed since success: 1 file changed (numbers.txt)"),
        ("out/total", "ok", "1 file(s) re-read, digests match")]


def test_verify_of_an_empty_prefix_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify.main(["--prefix", str(tmp_path)]) == 2
    assert "no experiment under" in capsys.readouterr().out


def _object_store_round(prefix: str, script: str) -> None:
    first = Step(name="os/first", fn=fs_write,
                 config=FsWriteConfig(output_path=this_output_path(), text="abc"))
    second = Step(name="os/second", fn=fs_copy_upper, config=FsCopyConfig(
        input_path=output_path_of(first, "out.txt"), output_path=this_output_path()))
    cfg = ExecutorMainConfig(prefix=prefix, backend="local")
    result = run_experiment([second], cfg, verbose=False, script=script)
    assert result.status == "SUCCESS", result.summary
    storage = storage_for(prefix)
    out = result.output_path("os/second")
    manifest = read_manifest(storage, out, (read_status(storage, out) or {}).get("outputs")) or {}
    assert list(manifest["entries"]) == ["out.txt"] and manifest["entries"]["out.txt"]["size"] == 3
    assert storage.read_text(manifest_path(out)) is None  # one file: inside the SUCCESS status only
    assert read_manifest(storage, out) == manifest  # the status read when its summary is not given
    checksum = manifest["entries"]["out.txt"]["checksum"]
    assert checksum.split(":")[0] in ("etag", "md5")  # the store's own checksum, read from the listing
    assert verify.verify_step(storage, "os/second", out).result == verify.OK
    storage.fs.rm_file(f"{out}/out.txt")  # type: ignore[attr-defined]
    plan = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local", dry_run=True),
                          verbose=False, script=script)
    assert [(e.action, e.reason) for e in plan.plan.entries] == [
        ("skip", "already succeeded (attempt 1)"),
        ("run", "outputs changed since success: 1 file missing (out.txt); re-running")]
    assert verify.verify_step(storage, "os/second", out).result == verify.DIFFERS
    again = run_experiment([second], cfg, verbose=False, script=script)
    assert again.status == "SUCCESS" and [e.action for e in again.plan.entries] == ["skip", "run"]
    assert storage.read_text(f"{out}/out.txt") == "ABC"
    storage.write_text(f"{out}/out.txt", "XYZ")  # same size, other bytes: the store's checksum differs
    plan = run_experiment([second], ExecutorMainConfig(prefix=prefix, backend="local", dry_run=True),
                          verbose=False, script=script)
    assert plan.plan.entries[1].reason == \
        "outputs changed since success: 1 file changed (out.txt); re-running"


def test_outputs_checked_on_s3(s3_bucket: str) -> None:
    _object_store_round(f"{s3_bucket}/outputs-checked", "tests/outputs_s3.py")


def test_outputs_checked_on_gcs(fake_gcs_bucket: str) -> None:
    _object_store_round(f"{fake_gcs_bucket}/outputs-checked", "tests/outputs_gs.py")


def test_a_link_out_of_the_output_path_is_checked_as_a_link_not_by_what_it_points_at(tmp_path: Path) -> None:
    """W&B links `logs/debug-core.log` to a log in ~/.cache that its service keeps writing after the step
    succeeded: that must not make the next plan re-run the step; a link retargeted must."""
    step = Step(name="out/linked", fn=write_with_outside_log,
                config=WriteConfig(output_path=this_output_path()))
    out = _run([step], str(tmp_path)).output_path("out/linked")
    manifest = read_manifest(storage_for(out), out, (read_status(storage_for(out), out) or {})["outputs"])
    assert manifest is not None
    outside = out + ".outside.log"
    link = {"size": len(outside.encode()), "checksum": "link:" + outside}
    assert manifest["entries"]["logs/debug.log"] == link
    with open(outside, "a") as f:
        f.write("the service wrote more after success\n")
    assert _actions(_run([step], str(tmp_path), dry=True)) == [("skip", "already succeeded (attempt 1)")]
    assert verify.verify_step(storage_for(out), "out/linked", out).result == verify.OK

    os.remove(Path(out, "logs", "debug.log"))
    os.symlink(str(tmp_path / "elsewhere.log"), Path(out, "logs", "debug.log"))
    [(action, reason)] = _actions(_run([step], str(tmp_path), dry=True))
    assert action == "run" and "logs/debug.log" in reason
