"""One CLI convention (issue 33, items 5 and 7): dashed help with real defaults, `--version`, one error for a
prefix that holds no experiments, quiet exits on a closed pipe and on Ctrl-C, colour only on a terminal."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marin.cli import main as marin_main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lib/moe_trainer/src")])}


def test_run_help_spells_flags_with_dashes_and_shows_real_defaults(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert marin_main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--dry-run", "--run-only REGEX...", "--force-run-failed", "--ray-address ADDRESS",
                 "--max-concurrent N", "--lease-timeout-s SECONDS", "-q, --quiet"):
        assert f"  {flag}\n" in out, flag
    assert "(default: None)" not in out and "--dry_run\n" not in out and "--run_only" not in out
    flat = " ".join(out.split())  # the help is wrapped
    assert "(default: $MARIN_PREFIX, else ./marin-out)" in flat and "(default: ray)" in flat
    assert "(default: 60.0)" in flat and "(default: false)" in flat


def test_quiet_help_says_what_it_does_and_plan_ignores_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """-q quiets a run (tests/marin/test_run_report.py checks what a quiet run prints); `marin plan -q` still
    prints the plan, which is what it was asked for, and the help says both."""
    assert marin_main(["run", "--help"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert ("-q, --quiet For run: print only the end (the summary line, each step's headline numbers, the "
            "verdict) and warnings; no plan table, start banner or live progress. plan and status print what "
            "they show either way. (default: false)") in flat
    prefix = str(tmp_path / "out")
    script = str(ROOT / "experiments" / "hello_world.py")
    outputs = []
    for quiet in ([], ["-q"]):
        assert marin_main(["plan", script, "--prefix", prefix, *quiet]) == 0
        captured = capsys.readouterr()
        outputs.append(captured.out + captured.err)
    assert f"plan under {prefix}" in outputs[1] and "run     demo/total" in outputs[1]
    assert outputs[0] == outputs[1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert marin_main(["--version"]) == 0
    assert capsys.readouterr().out == f"marin {expected}\n"


@pytest.mark.parametrize("command", [
    ["status"], ["catalogue"], ["verdict", "exp2"], ["predictions"], ["issue", "list"],
    ["issue", "show", "local/experiments#1"],
], ids=["status", "catalogue", "verdict", "predictions", "issue-list", "issue-show"])
def test_a_prefix_without_experiments_is_one_error_everywhere(command: list[str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    prefix = str(tmp_path / "wrong")
    os.makedirs(prefix)
    assert marin_main([*command, "--prefix", prefix]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"marin {command[0]}: error: no experiments under {prefix} ")
    assert f"{prefix}/experiments/*.json" in captured.err  # the file it looked for
    assert "Fix: pass --prefix with the prefix your runs wrote to" in captured.err  # and the fix


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`marin run --help | head -1`: the reader left before marin wrote; no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "marin", "run", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


def test_ctrl_c_is_one_line_and_the_step_is_preempted(tmp_path: Path) -> None:
    prefix, started, release = tmp_path / "out", tmp_path / "started", tmp_path / "release"
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(f"""
        from marin import Step, executor_main, this_output_path
        from tests.marin.fns import BlockConfig, block_until_released

        slow = Step(name="slow/step", fn=block_until_released,
                    config=BlockConfig(this_output_path(), {str(started)!r}, {str(release)!r}))
        if __name__ == "__main__":
            executor_main([slow])
    """))
    proc = subprocess.Popen([sys.executable, "-m", "marin", "run", str(script), "--prefix", str(prefix),
                             "--backend", "local"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            cwd=ROOT, text=True)
    deadline = time.time() + 120
    while not started.exists():
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted (Ctrl-C): running steps were recorded PREEMPTED" in err
    assert "run the same command again to resume them" in err  # the fix
    [status] = list(prefix.glob("slow/step-*/.marin/status.json"))
    assert '"PREEMPTED"' in status.read_text()


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    from marin import colour

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour.word("SUCCESS", Tty()) == "\033[32mSUCCESS\033[0m"
    assert colour.word("did_not_work", Tty()) == "\033[31mdid_not_work\033[0m"
    assert colour.word("SUCCESS", io.StringIO()) == "SUCCESS"  # a pipe or a file: no colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert colour.word("SUCCESS", Tty()) == "SUCCESS"


def test_a_mistyped_flag_suggests_the_right_one(capsys: pytest.CaptureFixture[str]) -> None:
    from marin.execution.argv import parse_flags

    with pytest.raises(SystemExit) as exited:
        parse_flags(["--dryrun"])
    assert exited.value.code == 2
    assert "--dryrun is not a flag; did you mean --dry-run?" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["run"], ["plan"], ["status"], ["dashboard"], ["issue", "new"], ["issue", "show"], ["issue", "list"],
    ["submit"], ["jobs"], ["predictions"], ["verdict"], ["catalogue"],
], ids=lambda c: "-".join(c))
def test_every_subcommand_help_uses_dashes_and_no_none_default(command: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import re

    try:
        marin_main([*command, "--help"])
    except SystemExit as e:  # argparse-based subcommands exit after printing their help
        assert e.code in (0, None)
    out = capsys.readouterr().out
    assert "--" in out
    assert not re.findall(r"--[a-z]+_[a-z_]+", out), out  # flags spelled with dashes
    assert not re.findall(r"--[a-z-]+ [A-Z]+_[A-Z_]+", out), out  # and their values named without '_'
    assert "(default: None)" not in out


def test_jobs_list_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`marin jobs list --format json`, against a stand-in for Ray's JobSubmissionClient."""
    import json
    from types import SimpleNamespace

    from marin.cluster.jobs_cli import _list

    job = SimpleNamespace(submission_id="marin-exp2_x-1a2b3c4d-1", status="RUNNING",
                          start_time=1_764_000_000_000, end_time=None, error_type=None, message="",
                          driver_exit_code=None,
                          runtime_env={"py_modules": ["sealed"]},
                          metadata={"marin_experiment": "exp2_x-1a2b3c4d", "marin_kind": "run",
                                    "marin_issue": "o/r#2", "marin_script": "experiments/exp2_x.py",
                                    "marin_prefix": "gs://b/p"})
    client = SimpleNamespace(list_jobs=lambda: [job, SimpleNamespace(metadata={})])
    assert _list(client, "json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["submission_id"], row["experiment"], row["issue"], row["start_time"]) == (
        "marin-exp2_x-1a2b3c4d-1", "exp2_x-1a2b3c4d", "o/r#2", 1_764_000_000.0)
    assert "runtime_env" not in row


def test_a_first_ctrl_c_is_posted_to_the_executor_and_a_second_raises_at_once() -> None:
    """The run's SIGINT handler (main.py) turns the first Ctrl-C into a message the executor's loop raises
    at a known point (never inside a publisher holding a lock that the clean-up takes again); a second one,
    for a loop that does not come back, raises where it lands."""
    import queue

    from marin.execution.backend import Interrupted
    from marin.execution.main import _on_sigint_at_a_safe_point

    completions: queue.SimpleQueue[object] = queue.SimpleQueue()
    previous = _on_sigint_at_a_safe_point(completions)
    try:
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)
        handler(signal.SIGINT, None)
        assert isinstance(completions.get_nowait(), Interrupted) and completions.empty()
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, previous)
