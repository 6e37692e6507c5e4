"""`marin run|plan|status SCRIPT [flags]`, plus `marin dashboard ...` and `marin issue ...`.

`run`, `plan` and `status` execute the experiment script as `__main__` with the given flags; its
`executor_main(...)` call does the work (`plan`/`status` tell it to report instead of running). The flags are
the same as for `python SCRIPT ...` (see `marin run --help`). `dashboard` and `issue` are dispatched to their
own packages, imported only when used.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import sys
from collections.abc import Sequence

from marin.errors import ExperimentFailedError, InfeasibleResourcesError, StepDefinitionError, StorageError
from marin.execution.argv import ExecutorMainConfig
from marin.execution.main import cli_mode

USAGE = """usage: marin <command> [args]

commands:
  run SCRIPT [flags]      plan and run an experiment script's steps
  plan SCRIPT [flags]     show what `run` would do and why (--format table|json); writes nothing
  status [SCRIPT] [flags] current status of a script's steps, or of every experiment under --prefix
  dashboard ...           the web dashboard (marin dashboard --help)
  issue ...               the experiment's issue tracker (marin issue --help)
  submit SCRIPT [flags]   run the experiment's driver on a Ray cluster as a job (marin submit --help)
  jobs list|logs|stop     the experiments' jobs on a Ray cluster (marin jobs --help)
  predictions [--prefix]  every pre-registered prediction, its verdict and the interval hit rate
  verdict EXP [OUTCOME]   show, set (--note, --by) or --recompute an experiment's verdict (docs/notebook.md)
  catalogue [--prefix]    every experiment's hypothesis and verdict (--outcome, --tag, --format markdown)
  compare A [B ...]       runs side by side: metrics with differences, config diff, curves (--format json)
  publish --prefix P --out DIR   a static site of the experiments publish.toml makes public (docs/publish.md)

flags (also accepted by `python SCRIPT ...`):
"""

DELEGATES = {"dashboard": "marin.dashboard.cli", "issue": "marin.tracking.cli",
             "submit": "marin.cluster.submit",
             "jobs": "marin.cluster.jobs_cli",
             "predictions": "marin.tracking.predictions_cli",
             "verdict": "marin.tracking.verdict_cli", "catalogue": "marin.tracking.catalogue_cli",
             "compare": "marin.compare.cli", "publish": "marin.publish.cli"}


def _print_help(command: str = "run") -> None:
    """The usage, then draccus's help for the flags (built from ExecutorMainConfig's field docstrings)."""
    import draccus

    print(USAGE)
    print("Flags may also be spelled with dashes (--dry-run), booleans alone mean true, and --run-only takes")
    print("several regexes (--run-only tokenize train).\n")
    sys.stdout.flush()
    with contextlib.suppress(SystemExit):  # argparse exits after printing the help
        draccus.parse(ExecutorMainConfig, args=["--help"], prog=f"marin {command} SCRIPT")


def _run_script(mode: str, script: str, flags: list[str]) -> int:
    if not os.path.exists(script):
        print(f"marin {mode}: no such script {script!r}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *flags]
    sys.path[:0] = [os.path.dirname(os.path.abspath(script)), os.getcwd()]
    try:
        with cli_mode(mode):
            runpy.run_path(script, run_name="__main__")
    except ExperimentFailedError:
        return 1  # the summary naming each failed step and its log was already printed
    except (StepDefinitionError, InfeasibleResourcesError, StorageError, ValueError) as e:
        print(f"marin {mode}: error: {e}", file=sys.stderr)
        return 2
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _status_all(flags: list[str]) -> int:
    from marin.execution.argv import parse_flags
    from marin.status.manifest import list_manifests
    from marin.storage.fs import normalize_prefix, storage_for

    cfg = parse_flags(flags)
    prefix = normalize_prefix(cfg.resolved_prefix())
    manifests = list_manifests(storage_for(prefix), prefix)
    if cfg.format == "json":
        import json

        print(json.dumps([{"id": m.get("id"), "script": m.get("script"), "issue": m.get("issue"),
                           "last_run": (m.get("runs") or [None])[-1]} for m in manifests], indent=1))
        return 0
    print(f"experiments under {prefix}:")
    for m in manifests:
        last = (m.get("runs") or [{}])[-1]
        print(f"  {str(last.get('status')):<8} {m.get('id')}  {m.get('script')}  issue={m.get('issue')}  "
              f"runs={len(m.get('runs') or [])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        _print_help()
        return 0
    command, rest = args[0], args[1:]
    if command in DELEGATES:
        public = command == "dashboard" and "--public" in rest
        target = "marin.publish.serve" if public else DELEGATES[command]
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name and DELEGATES[command].startswith(e.name):
                print(f"marin {command}: this subcommand is not available in this installation "
                      f"({DELEGATES[command]} is missing)", file=sys.stderr)
                return 2
            raise
        return int(module.main(rest))
    if command not in ("run", "plan", "status"):
        print(f"marin: unknown command {command!r}; valid commands: run, plan, status, dashboard, issue, "
              "submit, jobs, predictions, verdict, catalogue, compare, publish",
              file=sys.stderr)
        return 2
    if not rest and command == "status":
        return _status_all(rest)
    if not rest or rest[0] in ("-h", "--help"):
        _print_help(command)
        return 0
    if command == "status" and rest[0].startswith("--"):
        return _status_all(rest)
    if command == "run":
        from marin.cluster.job_env import apply_job_env

        apply_job_env()  # a driver started by `marin submit`: its sealed credentials
    return _run_script(command, rest[0], rest[1:])


if __name__ == "__main__":
    raise SystemExit(main())
