"""Raw inputs fingerprinted (issue 35): a config value naming an existing path outside the DAG is
fingerprinted at every plan; new bytes at the same path give the step (and its dependents) a new identity
under the default `rerun` policy, with the plan naming the input, or a warning under `warn`. On local
disk, moto's S3 server and fake-gcs-server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marin import ExecutorMainConfig, Step, output_path_of, prefix_path, run_experiment, this_output_path
from marin.definition.identity import raw_input_candidates
from marin.errors import StorageError
from marin.graph.dag import build_graph
from marin.graph.raw_inputs import RawInputs
from marin.storage.fingerprints import SMALL_FILE_BYTES
from marin.storage.fs import storage_for
from marin.storage.listing import FileInfo
from marin.storage.local import LocalStorage
from tests.marin.fns import FsCopyConfig, NoopConfig, SumConfig, fs_copy_upper, noop, sum_numbers


def _pair(raw: str, policy: str | None = None) -> tuple[Step, Step]:
    total = Step(name="raw/total", fn=sum_numbers, raw_inputs=policy,
                 config=SumConfig(input_path=raw, output_path=this_output_path()))
    after = Step(name="raw/after", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                              inputs=(output_path_of(total),)))
    return total, after


def _run(steps: list[Step], prefix: Path, dry: bool = False, policy: str = "rerun"):  # type: ignore[no-untyped-def]
    return run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), backend="local", dry_run=dry,
                                                    raw_inputs=policy), verbose=False, script="tests/raw.py")


def test_candidates_are_paths_urls_globs_and_prefix_paths_but_not_outputs_or_dag_paths() -> None:
    numbers = Step(name="c/n", fn=noop, config=NoopConfig(output_path=this_output_path()))
    config = NoopConfig(output_path="/abs/out", inputs=("/data/a.txt", "gs://b/x/*.jsonl", "relative/x",
                                                        "text",
                                                        output_path_of(numbers), prefix_path("raw/y")))
    found = raw_input_candidates(config)
    assert [(f, v if isinstance(v, str) else f"$prefix:{v.path}") for f, v in found] == [
        ("config.inputs[0]", "/data/a.txt"), ("config.inputs[1]", "gs://b/x/*.jsonl"),
        ("config.inputs[5]", "$prefix:raw/y")]


def test_steps_without_raw_inputs_keep_their_hashes(tmp_path: Path) -> None:
    numbers = Step(name="c/n", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                          inputs=(str(tmp_path / "absent.txt"),)))
    plain = build_graph([numbers]).node_of(numbers)
    read = build_graph([numbers], RawInputs(str(tmp_path / "p"))).node_of(numbers)
    assert read.hash == plain.hash and "raw_inputs" not in read.identity  # a path that does not exist


def test_new_bytes_at_the_same_path_re_run_the_step_and_its_dependents(tmp_path: Path) -> None:
    raw = tmp_path / "numbers.txt"
    raw.write_text("1\n2\n")
    total, after = _pair(str(raw))
    first = _run([after], tmp_path / "p")
    assert first.status == "SUCCESS"
    info = json.loads(Path(first.output_path("raw/total"), ".marin/step.json").read_text())
    recorded = info["raw_inputs"]["inputs"]["config.input_path"]
    assert info["raw_inputs"]["policy"] == "rerun" and recorded["path"] == str(raw) and recorded["bytes"] == 4
    assert info["identity"]["raw_inputs"] == {"config.input_path": recorded["digest"]}
    os.utime(raw, ns=(1, 1))  # the same bytes, another mtime: a small file is identified by its content
    assert [e.action for e in _run([after], tmp_path / "p", dry=True).plan.entries] == ["skip", "skip"]
    raw.write_text("1\n2\n3\n")
    plan = _run([after], tmp_path / "p", dry=True).plan.entries
    assert [e.action for e in plan] == ["run", "run"]
    assert len(plan[0].changed) == 1 and plan[0].changed[0].startswith(
        f"raw input {raw}: mtime_ns {recorded['version']} -> ")
    assert "size 4 -> 6, sha256 " in plan[0].changed[0]
    # the dependency's reason, whole or cut at the plan's 200-character cap (the temp path's length varies)
    [dependency] = plan[1].changed
    full = f"dependency raw/total changed: {plan[0].changed[0]}"
    assert dependency == full or (dependency.endswith("...") and full.startswith(dependency[:-3])
                                  and len(dependency) < len(full))
    again = _run([after], tmp_path / "p")
    assert again.status == "SUCCESS"
    assert Path(again.output_path("raw/total"), "total.txt").read_text() == "6\n"
    assert Path(first.output_path("raw/total"), "total.txt").read_text() == "3\n"  # the old result is kept


def test_new_bytes_re_address_the_steps_but_the_experiment_keeps_its_id(tmp_path: Path) -> None:
    raw = tmp_path / "numbers.txt"
    raw.write_text("1\n2\n")
    total, after = _pair(str(raw))
    plain = build_graph([after])
    before = build_graph([after], RawInputs(str(tmp_path / "p")))
    raw.write_text("1\n2\n3\n")
    changed = build_graph([after], RawInputs(str(tmp_path / "p")))
    assert before.node_of(after).hash != changed.node_of(after).hash != plain.node_of(after).hash
    assert before.experiment_hash == changed.experiment_hash == plain.experiment_hash
    first = _run([after], tmp_path / "q")
    raw.write_text("4\n")
    again = _run([after], tmp_path / "q")
    assert [e.action for e in again.plan.entries] == ["run", "run"]
    assert first.experiment_id == again.experiment_id  # one manifest, one run history


def test_policy_warn_reuses_the_result_and_the_plan_warns(tmp_path: Path) -> None:
    raw = tmp_path / "numbers.txt"
    raw.write_text("5\n")
    total, _ = _pair(str(raw), policy="warn")
    plain = build_graph([total]).node_of(total)
    first = _run([total], tmp_path / "p")
    assert first.plan.entries[0].hash == plain.hash  # warn: identity as before fingerprints
    info = json.loads(Path(first.output_path("raw/total"), ".marin/step.json").read_text())
    assert info["raw_inputs"]["policy"] == "warn" and "raw_inputs" not in info["identity"]
    raw.write_text("55\n")
    entry = _run([total], tmp_path / "p", dry=True).plan.entries[0]
    assert entry.action == "skip" and len(entry.warnings) == 1
    assert entry.warnings[0].startswith(f"raw input {raw}: ") and entry.warnings[0].endswith(
        "since this step ran; its result is reused (raw-input policy warn)")


def test_the_run_policy_applies_to_steps_without_their_own(tmp_path: Path) -> None:
    raw = tmp_path / "numbers.txt"
    raw.write_text("5\n")
    total, _ = _pair(str(raw))
    warned = _run([total], tmp_path / "p", dry=True, policy="warn").plan.entries[0]
    rerun = _run([total], tmp_path / "p", dry=True).plan.entries[0]
    assert warned.hash == build_graph([total]).node_of(total).hash != rerun.hash
    with pytest.raises(ValueError, match="--raw-inputs 'sometimes' is not one of"):
        ExecutorMainConfig(raw_inputs="sometimes")


def test_directories_and_globs_are_fingerprinted_as_a_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("a")
    (data / "sub" / "b.txt").write_text("b")
    step = Step(name="raw/whole", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                            inputs=(str(data), f"{data}/**/*.txt")))
    reader = RawInputs(str(tmp_path / "p"))

    def fingerprints() -> dict[str, tuple[str, int, str]]:
        node = build_graph([step], reader).node_of(step)
        assert node.inputs is not None
        return {f: (fp.kind, fp.files, fp.digest) for f, fp in node.inputs.fingerprints.items()}

    before = fingerprints()
    assert [(f, k, n) for f, (k, n, _) in before.items()] == [("config.inputs[0]", "directory", 2),
                                                             ("config.inputs[1]", "glob", 2)]
    (data / "sub" / "c.txt").write_text("c")
    after = fingerprints()
    assert all(after[f][2] != before[f][2] for f in before) and after["config.inputs[1]"][1] == 3
    (data / "sub" / "c.txt").unlink()
    assert fingerprints() == before


def test_a_large_local_file_is_identified_by_size_and_mtime(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(SMALL_FILE_BYTES + 1)
    step = Step(name="raw/big", fn=noop,
                config=NoopConfig(output_path=this_output_path(), inputs=(str(big),)))
    node = build_graph([step], RawInputs(str(tmp_path))).node_of(step)
    assert node.inputs is not None
    assert node.inputs.fingerprints["config.inputs[0]"].checksum == f"mtime:{big.stat().st_mtime_ns}"


class _Unreadable(LocalStorage):
    def file_info(self, path: str) -> FileInfo | None:
        raise PermissionError(13, "Permission denied", path)


def test_an_unreadable_fingerprint_is_an_error_naming_the_step_and_the_path(tmp_path: Path) -> None:
    raw = tmp_path / "secret.txt"
    raw.write_text("x")
    total, _ = _pair(str(raw))
    with pytest.raises(StorageError) as caught:
        build_graph([total], RawInputs(str(tmp_path), storage_of=lambda p: _Unreadable()))
    assert str(caught.value).startswith(f"step raw/total: cannot read the fingerprint of raw input {raw}: "
                                        "PermissionError")
    assert "Fix its permissions or the path" in str(caught.value)


def _object_store_round(prefix: str, raw: str, script: str) -> None:
    storage = storage_for(prefix)
    storage.write_text(raw, "abc")
    copy = Step(name="os/copy", fn=fs_copy_upper, config=FsCopyConfig(input_path=raw,
                                                                     output_path=this_output_path()))
    after = Step(name="os/after", fn=noop, config=NoopConfig(output_path=this_output_path(),
                                                             inputs=(output_path_of(copy),)))
    cfg = ExecutorMainConfig(prefix=prefix, backend="local")
    first = run_experiment([after], cfg, verbose=False, script=script)
    assert first.status == "SUCCESS", first.summary
    info = json.loads(storage.read_text(f"{first.output_path('os/copy')}/.marin/step.json") or "{}")
    recorded = info["raw_inputs"]["inputs"]["config.input_path"]
    assert recorded["path"] == raw and recorded["checksum"].split(":")[0] in ("etag", "md5")
    storage.write_text(raw, "abd")  # new bytes at the same path, the same size
    plan = run_experiment([after], ExecutorMainConfig(prefix=prefix, backend="local", dry_run=True),
                          verbose=False, script=script).plan.entries
    assert [e.action for e in plan] == ["run", "run"]
    assert plan[0].changed[0].startswith(f"raw input {raw}: ")
    assert plan[1].changed == [f"dependency os/copy changed: {plan[0].changed[0]}"]
    again = run_experiment([after], cfg, verbose=False, script=script)
    assert again.status == "SUCCESS" and storage.read_text(f"{again.output_path('os/copy')}/out.txt") == "ABD"
    assert storage.read_text(f"{first.output_path('os/copy')}/out.txt") == "ABC"


def test_raw_input_replaced_on_s3(s3_bucket: str) -> None:
    _object_store_round(f"{s3_bucket}/raw-inputs", f"{s3_bucket}/raw-data/in.txt", "tests/raw_s3.py")


def test_raw_input_replaced_on_gcs(fake_gcs_bucket: str) -> None:
    _object_store_round(f"{fake_gcs_bucket}/raw-inputs", f"{fake_gcs_bucket}/raw-data/in.txt",
                        "tests/raw_gs.py")
