#!/usr/bin/env python3
"""The project's two entry points for a newcomer, needing nothing but python3.

    python3 dev.py run     # the main job: the tutorial experiment on embedded defaults
    python3 dev.py test    # the whole test suite (what CI runs)

Both first make ``.venv`` (a virtual environment inside the checkout) and install the project, the trainer
library and their dependencies into it; a stamp file keyed on the dependency lists makes a second call skip
the install. Installing needs the package registries; everything after that runs without the network.

Ray and Chromium probe outside addresses even when told to stay on loopback, so when this script runs as root
it runs the job and the tests inside a private network namespace (``unshare -n`` with only loopback up):
nothing they do can leave the machine. Other flags after ``run``/``test`` are passed through (to the
experiment script or to pytest).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".marin-install-stamp"
MAIN_JOB = ROOT / "experiments" / "tutorials" / "tiny_moe.py"
TORCH_SPEC = "torch==2.13.0"  # the CPU build that lies on these machines; pip finds it through PIP_FIND_LINKS
LM_EVAL_HF_SPEC = "lm-eval[hf]==0.4.13"  # accelerate + peft need torch: installed by pip together with it


def log(msg: str) -> None:
    print(f"[dev] {msg}", flush=True)


def sh(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def install_fingerprint(with_tests: bool) -> str:
    h = hashlib.sha256()
    for f in ("pyproject.toml", "lib/moe_trainer/pyproject.toml", "dev.py"):
        h.update((ROOT / f).read_bytes())
    h.update(b"test" if with_tests else b"run")
    return h.hexdigest()


def ensure_venv(with_tests: bool) -> None:
    want = install_fingerprint(with_tests)
    have = STAMP.read_text().split() if STAMP.exists() else []
    if want in have:
        if with_tests:
            ensure_pygithub_sdist()  # also on a venv installed before this step existed
        return
    if not PY.exists():
        log(f"creating {VENV}")
        sh([sys.executable, "-m", "venv", str(VENV)])
    log("installing the project and its dependencies (uv; about a minute on a fresh machine)")
    sh([str(PY), "-m", "pip", "install", "-q", "--upgrade", "uv"])
    extra = ".[test]" if with_tests else "."
    # --compile-bytecode: this machine sets PYTHONDONTWRITEBYTECODE=1 and uv does not compile by default, so
    # without it every process recompiled jax, ray and the rest from source (about 3 s of CPU per process)
    uv = [str(PY), "-m", "uv", "pip", "install", "--python", str(PY), "-q", "--compile-bytecode"]
    sh(uv + ["-e", "lib/moe_trainer", "-e", extra], cwd=ROOT)
    if with_tests:
        log(f"installing {TORCH_SPEC} (CPU) and {LM_EVAL_HF_SPEC} for the transformers and lm-eval tests")
        sh([str(PY), "-m", "pip", "install", "-q", TORCH_SPEC, LM_EVAL_HF_SPEC])
        ensure_chromium()
        ensure_pygithub_sdist()
    STAMP.write_text("\n".join([*have, want]) + "\n")


def ensure_pygithub_sdist() -> None:
    """PyGithub's source distribution, whose tests/ReplayData holds recorded api.github.com exchanges: the
    GitHub tracker's replay tests read it (tests/fakes/replay_github.py). Downloaded here because the tests
    run without network; the version is the installed one, so the recordings match the client."""
    version = subprocess.run([str(PY), "-c", "import importlib.metadata as m; print(m.version('PyGithub'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    dest = VENV / "cache" / "pygithub-sdist"
    if (dest / f"pygithub-{version}.tar.gz").exists():
        return
    log(f"downloading the PyGithub {version} sdist (its recorded GitHub exchanges) into {dest}")
    sh([str(PY), "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
        f"PyGithub=={version}", "-d", str(dest)])


def ensure_chromium() -> None:
    """The dashboard's browser tests drive Debian's Chromium through Playwright (no browser download)."""
    if shutil.which("chromium") or Path("/usr/bin/chromium").exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        log("chromium is missing and cannot be installed without root/apt: browser tests will be skipped")
        return
    log("installing Debian's chromium for the browser tests")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
    sh(["apt-get", "install", "-y", "-q", "chromium"], env=env, stdout=subprocess.DEVNULL)


def offline_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "WANDB_MODE": env.get("WANDB_MODE", "offline"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            "TOKENIZERS_PARALLELISM": env.get("TOKENIZERS_PARALLELISM", "false"),
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    return env


def compile_project() -> None:
    """Byte-compile the project's own packages (only what changed since the last time; a second or two).

    With PYTHONDONTWRITEBYTECODE=1 set, as on these machines, no process writes .pyc files, so each of the
    many step, Ray worker and test subprocesses would otherwise compile the same sources again."""
    packages = ("marin", "operators", "openlab_records", "experiments", "tests", "benchmarks",
                "lib/moe_trainer")
    dirs = [d for d in packages if (ROOT / d).is_dir()]
    subprocess.run([str(PY), "-m", "compileall", "-q", "-j", "0", *dirs], cwd=ROOT, stdout=subprocess.DEVNULL,
                   check=False)  # a file that does not compile is reported by the run itself, not here


def in_private_network(cmd: list[str]) -> list[str]:
    """Wrap cmd so it runs with only loopback networking, when this machine lets us (root + unshare)."""
    if os.environ.get("MARIN_NETNS") == "1":
        return cmd  # already inside one
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        quoted = " ".join(shlex.quote(c) for c in cmd)
        return ["unshare", "-n", "sh", "-c", f"ip link set lo up && MARIN_NETNS=1 exec {quoted}"]
    log("not root: running without a private network namespace (Ray may probe outside addresses)")
    return cmd


def parallel(pytest_args: list[str]) -> list[str]:
    """pytest-xdist flags for the suite: one worker per core, at most four, unless the caller chose (``-n``,
    or ``-p no:xdist``). conftest.py keeps each module on one worker, and every Ray-starting module on the
    same one, and hands the modules out longest first (by measured module times)."""
    chosen = any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n", "--numprocesses="))
                 for a in pytest_args)
    workers = min(os.cpu_count() or 1, 4)
    return [] if chosen or workers < 2 else ["-n", str(workers), "--dist", "loadscope"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test", "install"):
        print(__doc__)
        return 2
    what, rest = argv[0], argv[1:]
    ensure_venv(with_tests=what in ("test", "install"))
    compile_project()
    if what == "install":
        return 0
    if what == "run":
        cmd = [str(PY), str(MAIN_JOB), *rest]
    else:
        cmd = [str(PY), "-m", "pytest", *parallel(rest), *rest]
    log("running: " + " ".join(cmd))
    return subprocess.run(in_private_network(cmd), cwd=ROOT, env=offline_env()).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
