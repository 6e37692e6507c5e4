"""What a run tells the outside while and after it runs: the publishers' `RunView`s and the summary text.

A view lists every step, so one per transition makes a run quadratic in its size (2,000 transitions x 1,000
steps for a 1,000-step fan-out). Runs of up to VIEW_EVERY_TRANSITION_MAX_STEPS steps publish every transition
(the terminal progress shows each RUNNING and SUCCESS); larger runs publish at most every VIEW_INTERVAL_S:
a newer state not yet published is published once the interval has passed, even if the executor is then
only waiting (`due` tells it when to wake up for it).
"""

from __future__ import annotations

import time
from typing import Any

from marin.execution.state import StepState
from marin.graph.plan import Plan
from marin.status import files as sf
from marin.status.publisher import PublisherSet, RunContext, RunView, StepView

VIEW_EVERY_TRANSITION_MAX_STEPS = 100
VIEW_INTERVAL_S = 0.2


class RunViews:
    """Publishes views of a run built from the executor's step states (set `states` once it exists)."""

    def __init__(self, publishers: PublisherSet, run: RunContext, started: float, plan: Plan) -> None:
        self.publishers = publishers
        self.run = run
        self.started = started
        self.plan = plan
        self.states: dict[str, StepState] = {}
        self._interval = 0.0 if len(plan.entries) <= VIEW_EVERY_TRANSITION_MAX_STEPS else VIEW_INTERVAL_S
        self._published_at = float("-inf")
        self._dirty = False

    def changed(self) -> None:
        """A step's state changed: publish now, or once the interval has passed."""
        self._dirty = bool(self.publishers)
        self.due()

    def due(self) -> float | None:
        """Publish the newest state if it is due; otherwise the seconds until it will be (None: nothing
        new)."""
        if not self._dirty:
            return None
        wait = self._published_at + self._interval - time.monotonic()
        if wait > 0:
            return wait
        self._published_at, self._dirty = time.monotonic(), False
        self.publishers.publish(self.view("RUNNING", None), final=False)
        return None

    def final(self, status: str, ended: float) -> None:
        if self.publishers:
            self.publishers.publish(self.view(status, ended), final=True)

    def view(self, status: str, ended: float | None) -> RunView:
        r = self.run
        steps = tuple(_step_view(e.name, e.hash, e.output_path, tuple(e.dependencies),
                                 self.states.get(e.hash)) for e in self.plan.entries)
        return RunView(r.experiment_id, r.run_id, r.script, r.description, r.issue, r.prefix, status,
                       self.started, ended, steps)


def _step_view(name: str, key: str, output_path: str, dependencies: tuple[str, ...],
               st: StepState | None) -> StepView:
    step_status = (st.status if st and not st.queued and not st.waiting else None) or sf.WAITING
    attempt = st.attempt if st else 0
    err = st.error if st else None
    return StepView(
        name=name, hash=key, output_path=output_path, status=step_status, attempt=attempt,
        started=st.started if st else None, ended=st.ended if st else None,
        error_summary=f"{err.get('type')}: {err.get('message')}" if err else (st.note if st and st.status in (
            sf.FAILED, sf.DEP_FAILED) else None),
        log_path=sf.log_path(output_path, attempt) if attempt else None,
        dependencies=dependencies, waiting=st.waiting if st else None)


def summary(states: dict[str, StepState], publisher_errors: list[dict[str, Any]], wall_s: float,
            experiment_id: str, prefix: str) -> str:
    """The text printed at the end of a run: counts by status, then every step that did not succeed."""
    counts: dict[str, int] = {}
    unsuccessful = []  # one pass over the steps; the lines below are only for these
    for st in states.values():
        status = st.status
        if status != sf.SUCCESS:
            unsuccessful.append(st)
            key = str(status)
        else:
            key = sf.SUCCESS if st.note == "ran" else f"{status}({st.note})"
        counts[key] = counts.get(key, 0) + 1
    lines = [f"experiment {experiment_id} under {prefix}: "
             + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f" in {wall_s:.2f} s"]
    for st in unsuccessful:
        lines.extend(_summary_lines(st))
    lines.extend(publisher_error_line(err) for err in publisher_errors)
    return "\n".join(lines)


def publisher_error_line(err: dict[str, Any]) -> str:
    """A publisher's (or an after-run hook's) error, as the run's summary prints it."""
    return f"  publisher {err['publisher']} failed (the run is unaffected): {err['error']}"


def _summary_lines(st: StepState) -> list[str]:
    short = f"{st.node.name} ({st.entry.hash[:8]})"
    if st.status in (sf.FAILED, sf.PREEMPTED) and st.failure is not None:
        return [f"  {st.status} {short}: {st.failure.summary}", f"      log: {st.failure.log_path}"]
    if st.status == sf.FAILED:
        prev_log = (st.previous or {}).get("log")
        logs = [f"      log: {sf.meta_dir(st.path)}/{prev_log}"] if prev_log else []
        return [f"  FAILED {short}: {st.note}", *logs]
    if st.status == sf.SUCCESS:
        return []
    return [f"  {st.status} {short}: {st.note}"]  # DEP_FAILED, and anything left unfinished
