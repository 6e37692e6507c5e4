"""`marin run|plan|status SCRIPT [flags]`, plus `marin dashboard ...` and `marin issue ...`.

`run`, `plan` and `status` execute the experiment script as `__main__` with the given flags; its
`executor_main(...)` call does the work (`plan`/`status` tell it to report instead of running). The flags are
the same as for `python SCRIPT ...` (see `marin run --help`). `dashboard` and `issue` are dispatched to their
own packages, imported only when used.

Conventions every subcommand keeps (README, "Running"): flags are spelled with dashes and
their help shows the real defaults; read commands take `--format json`; colour only on a terminal and never
with NO_COLOR; a prefix that holds no experiments is one error (NoExperimentsError, exit 2); a closed pipe
(`marin status | head`) ends quietly with exit 141 and Ctrl-C with one line and exit 130.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import sys
from collections.abc import Sequence

from marin.errors import (
    ExperimentFailedError,
    InfeasibleResourcesError,
    NoExperimentsError,
    StepDefinitionError,
    StorageError,
)
from marin.execution.argv import flags_help
from marin.execution.main import cli_mode

USAGE = """usage: marin <command> [args]      (marin --version: the installed version)

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
  verify [SCRIPT|PREFIX]  re-read every succeeded step's outputs and check them against its manifest
  reproduce EXP|PATH --prefix OTHER  re-run recorded steps from their record and compare output digests
  publish --prefix P --out DIR   a static site of the experiments publish.toml makes public (docs/publish.md)

flags (also accepted by `python SCRIPT ...`):
"""

DELEGATES = {"dashboard": "marin.dashboard.cli", "issue": "marin.tracking.cli",
             "submit": "marin.cluster.submit",
             "jobs": "marin.cluster.jobs_cli",
             "predictions": "marin.tracking.predictions_cli",
             "verdict": "marin.tracking.verdict_cli", "catalogue": "marin.tracking.catalogue_cli",
             "compare": "marin.compare.cli",
             "verify": "marin.status.verify", "reproduce": "marin.execution.reproduce",
             "publish": "marin.publish.cli"}


def _print_help(command: str = "run") -> None:
    """The usage, then the flags (ExecutorMainConfig's field docstrings, with dashes and real defaults)."""
    print(USAGE)
    print(flags_help())
    print("\nBooleans alone mean true (--dry-run); --run-only takes several regexes (--run-only tokenize")
    print("train), --force-run several step names (--force-run a b); the underscore spelling of a flag is")
    print("accepted too.")


def version() -> str:
    """The installed distribution's version (the checkout's pyproject when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("marin-openlab")
    except metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


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
    from marin.colour import word
    from marin.execution.argv import parse_flags
    from marin.status.manifest import require_manifests
    from marin.status.verdicts import headline, read_verdicts
    from marin.storage.fs import normalize_prefix, storage_for

    cfg = parse_flags(flags)
    prefix = normalize_prefix(cfg.resolved_prefix())
    storage = storage_for(prefix)
    problems: list[str] = []  # unreadable manifests, named with the fix (status/damaged.py)
    rows = []
    for m in require_manifests(storage, prefix, problems):
        current = (read_verdicts(storage, prefix, str(m.get("id"))) or {}).get("current") or {}
        rows.append({"id": m.get("id"), "script": m.get("script"), "issue": m.get("issue"),
                     "last_run": (m.get("runs") or [None])[-1], "runs": len(m.get("runs") or []),
                     "verdict": current.get("outcome"), "headline": headline(current)})
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if cfg.format == "json":
        import json

        print(json.dumps(rows, indent=1))
        return 0
    print(f"experiments under {prefix}:")
    if not rows:  # every manifest under the prefix is damaged: each named above, with its fix
        return 0
    width = max(len(str(r["id"])) for r in rows)
    print(f"  {'STATUS':<8} {'EXPERIMENT':<{width}}  {'VERDICT':<13} {'HEADLINE':<28} SCRIPT  ISSUE  RUNS")
    for r in rows:
        status, verdict = str((r["last_run"] or {}).get("status")), str(r["verdict"] or "-")
        h = r["headline"]
        metric = f"{h['metric'].split(':', 1)[-1]} {h['value']:.4g}" if h else "-"
        shown = word(f"{verdict:<13}", key=verdict)
        print(f"  {word(f'{status:<8}', key=status)} {r['id']:<{width}}  {shown} {metric:<28} "
              f"{r['script']}  issue={r['issue']}  runs={r['runs']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`marin ...`: the command's exit status; a closed pipe and Ctrl-C end it cleanly (module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    try:
        return _dispatch(args)
    except NoExperimentsError as e:
        print(f"marin {command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `marin status | head`: the reader left. Point stdout at /dev/null so that the interpreter's final
        # flush cannot raise again, and exit as a process killed by SIGPIPE would.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"marin {command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help", "help"):
        _print_help()
        return 0
    if args[0] in ("--version", "-V", "version"):
        print(f"marin {version()}")
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
              "submit, jobs, predictions, verdict, catalogue, compare, verify, reproduce, publish",
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
