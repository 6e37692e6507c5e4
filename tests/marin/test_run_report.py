"""Runs that report (issue 33, item 3): where to look at the start, live progress while steps run, every
headline number and the verdict in plain words at the end; `-q` keeps only the end. Every number printed is
compared with the file it came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lib/moe_trainer/src")]),
       "MARIN_TRACKER_MIN_INTERVAL": "0"}
SCRIPT = '''
"""exp3 demo.

Hypothesis: the new evaluation is lower than the base one by at least 0.05.

Criterion: eval/new:macro.bpb lower than eval/base by at least 0.05
"""
from marin import Step, executor_main, this_output_path
from tests.marin.notebook_fns import DeclaredEvalConfig, write_eval

base = Step(name="eval/base", fn=write_eval, config=DeclaredEvalConfig(this_output_path(), 1.3))
new = Step(name="eval/new", fn=write_eval, config=DeclaredEvalConfig(this_output_path(), 1.2125))
if __name__ == "__main__":
    executor_main([base, new], issue="local/experiments#3")
'''


def marin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marin", *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=300)


def test_a_run_says_where_to_look_then_what_it_found(tmp_path: Path) -> None:
    script, prefix = tmp_path / "demo.py", str(tmp_path / "out")
    script.write_text(textwrap.dedent(SCRIPT))
    done = marin("run", str(script), "--prefix", prefix, "--backend", "local")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    [manifest] = Path(prefix, "experiments").glob("demo-*.json")
    experiment = manifest.stem
    # at the start: the dashboard and the issue
    assert f"experiment {experiment} under {prefix}" in err
    assert f"dashboard: marin dashboard --prefix {prefix}" in err and f"/experiments/{experiment}" in err
    assert f"issue:     local/experiments#3   (marin issue show local/experiments#3 --prefix {prefix})" in err
    assert err.index("dashboard:") < err.index("RUNNING  eval/")  # before the steps run
    # while it runs: every state change
    assert "RUNNING  eval/new-" in err and "SUCCESS  eval/new-" in err
    # at the end: each headline number, read back from the file it came from
    paths = {json.loads(p.read_text())["name"]: p.parents[1]
             for p in Path(prefix).glob("eval/*/.marin/step.json")}
    for name in ("eval/base", "eval/new"):
        written = json.loads((paths[name] / "eval.json").read_text())
        for path, value in (("domains.python.bpb", written["domains"]["python"]["bpb"]),
                            ("macro.bpb", written["macro"]["bpb"])):
            assert f"eval.json  {path} = {value:.6g}" in err, (name, path)
    verdict = json.loads(Path(prefix, "experiments", experiment, "verdicts.json").read_text())["current"]
    [judged] = verdict["criteria"]
    assert verdict["outcome"] == "worked"
    assert (f"verdict: worked (the hypothesis held; 1 of 1 criteria met): eval/new:macro.bpb "
            f"{judged['value']:.4g} vs {judged['baseline_value']:.4g} (eval/base:macro.bpb; effect "
            f"{judged['effect']:+.4g}, needed >= 0.05)") in err
    # -q: only the end
    quiet = marin("run", str(script), "--prefix", prefix, "--backend", "local", "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert "plan under" not in quiet.stderr and "dashboard:" not in quiet.stderr
    assert "SKIPPED" not in quiet.stderr and "RUNNING" not in quiet.stderr
    assert "eval.json  macro.bpb = 1.2125" in quiet.stderr and "verdict: worked" in quiet.stderr
    # marin status: the verdict and the headline number beside the run's status
    status = marin("status", "--prefix", prefix)
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if experiment in line)
    assert row.split()[:4] == ["SUCCESS", experiment, "worked", "macro.bpb"]
    assert f" {judged['value']:.4g} " in row
    listed = json.loads(marin("status", "--prefix", prefix, "--format", "json").stdout)
    assert listed[0]["verdict"] == "worked" and listed[0]["headline"]["value"] == judged["value"]
