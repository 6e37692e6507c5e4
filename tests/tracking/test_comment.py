"""Rendering pieces of the status comment (property tests) and reading step outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from marin.tracking.comment import cell, duration, fence
from marin.tracking.outputs import TAIL_BYTES, innermost_frame, read_step_outputs


@given(st.text())
def test_cell_is_one_code_span_that_cannot_split_the_table(text: str) -> None:
    out = cell(text)
    if not out:
        assert text.split() == []
        return
    assert out.startswith("`") and out.endswith("`") and out.count("`") == 2
    assert "\n" not in out and re.search(r"(?<!\\)\|", out) is None


@given(st.text(alphabet=st.sampled_from("`ab\n~")))
def test_fence_cannot_be_closed_by_its_content(text: str) -> None:
    out = fence(text)
    ticks = out.split("\n", 1)[0]
    assert set(ticks) == {"`"} and len(ticks) >= 3
    assert out == f"{ticks}\n{text}\n{ticks}"
    assert ticks not in text  # no run of backticks in the text is as long as the fence


def test_duration() -> None:
    assert [duration(x) for x in (None, -1, 0.25, 59.9, 61, 3725)] == ["—", "—", "0.2 s", "59.9 s", "1m 01s",
                                                                        "1h 02m"]


def test_metrics_tail_of_a_large_file(tmp_path: Path) -> None:
    rows = [{"step": i, "loss": 10.0 / i, "lr": 1e-3, "expert_load": [[0.25] * 4] * 8} for i in range(1,
                                                                                                      2001)]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    assert len(text) > 4 * TAIL_BYTES  # only the tail is read
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 2001, "loss": 0.0')  # the trainer is mid-write
    out = read_step_outputs(str(tmp_path))
    assert (out.final_loss, out.loss_step, out.problems) == (10.0 / 2000, 2000, ())


def test_unreadable_outputs_are_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / "eval.json").write_text("{not json")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\nbroken line\n{"step": 2, "loss": '
                                            '0.5}\n')
    out = read_step_outputs(str(tmp_path))
    assert out.final_loss == 0.5  # a damaged line before the last good one does not matter
    assert out.problems == ("eval.json unreadable (JSONDecodeError)",)
    assert read_step_outputs(str(tmp_path / "missing")) == read_step_outputs(str(tmp_path / "missing2"))


def test_innermost_frame() -> None:
    tb = ('Traceback (most recent call last):\n  File "/a/runner.py", line 3, in run\n    fn(cfg)\n'
          '  File "/a/ops.py", line 9, in train\n    raise ValueError("x")\nValueError: x\n')
    assert innermost_frame(tb) == 'File "/a/ops.py", line 9, in train\n    raise ValueError("x")'
    assert innermost_frame("ValueError: x") is None


def test_the_status_comment_has_an_interruptions_section_from_the_ledger(tmp_path: Path) -> None:
    from marin.status.interruptions import record_interruption, record_resume
    from marin.status.publisher import RunView, StepView
    from marin.storage.fs import storage_for
    from marin.tracking.comment import render
    from marin.tracking.outputs import read_step_outputs

    out = str(tmp_path / "train-1a2b3c4d")
    storage = storage_for(out)
    record_interruption(storage, out, name="train", attempt=1, run_id="r", cause="node_died",
                        hosts=["10.0.0.7"], started=0.0, ended=30.0)
    record_resume(storage, out, attempt=2, started=40.0)
    step = StepView(name="train", hash="1a2b3c4d" * 8, output_path=out, status="SUCCESS", attempt=2,
                    started=0.0, ended=90.0, error_summary=None, log_path=None, dependencies=())
    quiet = StepView(name="other", hash="5e6f7a8b" * 8, output_path=str(tmp_path / "other"),
                     status="SUCCESS", attempt=1, started=0.0, ended=1.0, error_summary=None, log_path=None,
                     dependencies=())

    def body(steps: tuple[StepView, ...]) -> str:
        run = RunView("exp-1", "r", "s.py", "", None, str(tmp_path), "SUCCESS", 0.0, 90.0, steps)
        return render(run, issue_ref="local/x#1", outputs=lambda s: read_step_outputs(s.output_path),
                      now=100.0)

    full = body((step, quiet))
    section = full[full.index("#### Interruptions (1)"):]
    assert "**`train`**" in section
    assert "attempt 1 node_died hosts=10.0.0.7, attempt 2 from scratch, 40.0 s lost" in section
    assert "`other`" not in section
    assert "#### Interruptions" not in body((quiet,))


def test_a_gang_waiting_for_hosts_says_what_for_in_its_state_cell(tmp_path: Path) -> None:
    """The state cell of a WAITING step carries its waiting text (a gang waiting for hosts, gang_wait.py);
    other states, and a WAITING step with no text, keep their plain cell."""
    from marin.status.publisher import RunView, StepView
    from marin.tracking.comment import render
    from marin.tracking.outputs import read_step_outputs

    text = "waiting for 2 hosts with 1 CPU each; 1 available"

    def row(status: str, waiting: str | None) -> str:
        step = StepView(name="g", hash="1a2b3c4d" * 8, output_path=str(tmp_path / "g"), status=status,
                        attempt=2, started=None, ended=None, error_summary=None, log_path=None,
                        dependencies=(), waiting=waiting)
        run = RunView("exp-1", "r", "s.py", "", None, str(tmp_path), "RUNNING", 0.0, None, (step,))
        body = render(run, issue_ref="local/x#1", outputs=lambda s: read_step_outputs(s.output_path), now=1.0)
        [line] = [x for x in body.splitlines() if x.startswith("| `g` |")]
        return line

    assert f"| ⏳ WAITING: `{text}` | " in row("WAITING", text)
    # resource names are the user's: a mention or a link in one stays inert code
    assert "| ⏳ WAITING: `waiting for 2 hosts with 1 @team each; [x](http://e) available` | " in row(
        "WAITING", "waiting for 2 hosts with 1 @team each; [x](http://e) available")
    assert "| ⏳ WAITING | " in row("WAITING", None)
    assert "| 🔄 RUNNING | " in row("RUNNING", text)  # a stale text never outlives its state
