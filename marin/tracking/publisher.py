"""The issue-tracker publisher: keeps one status comment and the run labels of the linked issue up to date.

The executor calls :meth:`IssuePublisher.publish` after every state transition (``final=False``) and once at
the end (``final=True``). Non-final calls only record the newest view and wake a background flusher, so the
executor never waits on the network; the flusher publishes at once for the first view and then at most once
per ``min_interval_s`` (a 1,000-step run makes a few dozen API calls, not thousands). The final call stops
the flusher and publishes synchronously, so the comment and labels always end on the final state. While
nothing changes state, the flusher re-renders the comment when a running step tracked against a
prediction (marin/tracking/predictions.py) has a new evaluation, so "on track / off track" shows as it lands.

Each flush renders the body (:mod:`.comment`), finds the managed comment by its marker (listing the issue's
comments once per publisher: a restarted executor finds the comment of its previous run) or creates it, edits
it only when the body changed, and moves the ``marin:*`` label. Failures never reach the experiment: a
background flush that fails is retried at the next interval; only a final publish that fails after the
retry policy raises :class:`PublishError` (its message redacted), which the executor records in the run's
``publisher_errors`` and summary while the step results stay as they are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from marin import jsonio
from marin.errors import CorruptFileError
from marin.status.publisher import RunView, StepView
from marin.storage.fs import storage_for
from marin.tracking.alerts import AlertPoster
from marin.tracking.base import Tracker, TrackerAuthError, TrackerError, TrackerNotFound, TrackerUnavailable
from marin.tracking.comment import RUN_LABELS, marker, render
from marin.tracking.local import LocalTracker
from marin.tracking.notebook import set_verdict_label
from marin.tracking.outputs import StepOutputs, read_step_outputs
from marin.tracking.predictions import tracking_section
from marin.tracking.redact import redact
from marin.tracking.retry import BackoffPolicy, RetryAborted, Transient

logger = logging.getLogger(__name__)
TERMINAL_STEP_STATES = frozenset({"SUCCESS", "FAILED"})
MAX_KEPT_ERRORS = 20


class PublishError(RuntimeError):
    """The final status could not be published; the message names the issue and run and holds no token."""


class IssuePublisher:
    """Publishes one experiment's runs to issue ``number`` of ``tracker`` (see the module docstring)."""

    name = "issue-tracker"

    def __init__(self, tracker: Tracker, number: int, *, dashboard_url: str | None = None,
                 min_interval_s: float = 10.0, find_policy: BackoffPolicy | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.tracker, self.number = tracker, number
        self.issue_ref = f"{tracker.repo}#{number}"
        self.dashboard_url = dashboard_url.rstrip("/") if dashboard_url else None
        self.min_interval_s = min_interval_s
        self.find_policy = find_policy or BackoffPolicy(max_attempts=3, base_delay_s=1.0)
        self.clock = clock
        self.errors: list[str] = []
        """Redacted messages of the first MAX_KEPT_ERRORS failed flushes (a later flush may have
        recovered)."""
        self.error_count = 0
        # set by a failure that retrying cannot fix (credentials, missing issue)
        self._gave_up: str | None = None
        self.api_flushes = 0
        self._comment_id: int | None = None
        self._last_body: str | None = None
        self._labels: set[str] | None = None
        self._issue_checked = False
        self._outputs_cache: dict[tuple[str, str, int], StepOutputs] = {}
        self._pending: RunView | None = None
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._sync_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_flush = float("-inf")
        self._last_view: RunView | None = None
        self._last_tracking: list[str] | None = None
        self.alerts = AlertPoster(tracker, number, dashboard_url=self.dashboard_url, clock=clock)
        """Posts the steps' health alerts (marin/tracking/alerts.py) at every flush and between them."""

    def __repr__(self) -> str:
        return f"IssuePublisher({self.issue_ref}, tracker={self.tracker!r})"

    # -- the Publisher protocol ----------------------------------------------------------------------------

    def publish(self, run: RunView, final: bool) -> None:
        if not final:
            with self._cv:
                if self._stop.is_set():
                    return  # a view arriving after the final publish is older than what was published
                self._pending = run
                if self._thread is None:
                    self._thread = threading.Thread(target=self._flusher,
                                                    name=f"marin-publish-{self.issue_ref}",
                                                    daemon=True)
                    self._thread.start()
                self._cv.notify()
            return
        self.close()
        try:
            with self._sync_lock:
                self._sync(run)
        except (TrackerError, OSError, ValueError) as exc:
            earlier = (f"; {self.error_count} earlier failed updates, first: {self.errors[0]}"
                       if self.errors else "")
            raise PublishError(redact(
                f"could not publish the final status of run {run.run_id} of {run.experiment_id} to "
                f"{self.issue_ref} ({self.tracker.kind} tracker): {type(exc).__name__}: "
                f"{exc}{earlier}")) from None
        if self.errors:
            logger.warning("status of %s reached %s after %d failed updates (first: %s)", run.experiment_id,
                           self.issue_ref, self.error_count, self.errors[0])

    def close(self) -> None:
        """Stop the background flusher (interrupting a retry wait); an in-flight request completes."""
        with self._cv:
            self._stop.set()
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    # -- background flushing -------------------------------------------------------------------------------

    def _flusher(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._stop.is_set():
                    if not self._cv.wait(timeout=max(self.min_interval_s, 1.0)):
                        # a tracked step's evaluation landed, or an alert is due: re-render and post
                        self._pending = self._retrack() or self._alerts_due()
                if self._stop.is_set():
                    return
            wait = self._last_flush + self.min_interval_s - self.clock()
            if wait > 0 and self._stop.wait(wait):
                return
            with self._cv:
                view, self._pending = self._pending, None
            if view is None or self._gave_up is not None:
                continue  # after a permanent failure only the final publish tries again (and reports it)
            try:
                with self._sync_lock, self.tracker.abort_on(self._stop):
                    self._sync(view)
            except RetryAborted:
                return
            except Exception as exc:  # the flusher must survive anything: record it and retry next interval
                self._record_failure(exc)
                with self._cv:
                    if self._pending is None:
                        self._pending = view
            finally:
                self._last_flush = self.clock()

    def _retrack(self) -> RunView | None:
        """The last view again when the prediction tracking of its running steps changed (an evaluation
        landed in a step that writes tracking.json), so "on track / off track" appears without waiting for
        the next state transition; None otherwise."""
        view = self._last_view
        if view is None or view.status != "RUNNING":
            return None
        section = tracking_section([s for s in view.steps if s.status == "RUNNING"])
        if section == self._last_tracking:
            return None
        self._last_tracking = section
        return view

    def _alerts_due(self) -> RunView | None:
        """The last view again when one of its steps has an alert (or resolution) not posted yet."""
        view = self._last_view
        if view is None or view.status != "RUNNING":
            return None
        try:
            return view if self.alerts.due(view) else None
        except Exception as exc:  # an unreadable alerts file must not stop the flusher
            self._record_failure(exc)
            return None

    def _record_failure(self, exc: Exception) -> None:
        message = redact(f"{type(exc).__name__}: {exc}")
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(message)
        if isinstance(exc, TrackerAuthError | TrackerNotFound):
            self._gave_up = message
            logger.warning("status updates of %s stop until the final one: %s", self.issue_ref, message)
        else:
            logger.warning("status update of %s failed, will retry: %s", self.issue_ref, message)

    # -- one flush -----------------------------------------------------------------------------------------

    def _sync(self, run: RunView) -> None:
        self._last_view = run
        self._last_tracking = tracking_section([s for s in run.steps if s.status == "RUNNING"])
        self._ensure_issue(run)
        verdicts = self._read(f"{run.prefix.rstrip('/')}/experiments/{run.experiment_id}/verdicts.json")
        body = render(run, issue_ref=self.issue_ref, outputs=self._outputs, manifest=self._manifest(run),
                      dashboard_url=self._dashboard_link(run), now=self.clock(), verdicts=verdicts)
        if body != self._last_body:
            self._write_comment(run, body)
            self._last_body = body
        self._set_labels(run.status)
        current = verdicts.get("current") if isinstance(verdicts.get("current"), dict) else {}
        if self._labels is not None and current:
            self._labels = set_verdict_label(self.tracker, self.number, self._labels, current.get("outcome"))
        self.alerts.poll(run)
        self.api_flushes += 1

    def _ensure_issue(self, run: RunView) -> None:
        if self._issue_checked:
            return
        try:
            issue = self.tracker.get_issue(self.number)
        except TrackerNotFound:
            if not isinstance(self.tracker, LocalTracker):
                raise
            # a fresh prefix has an empty local tracker: re-create the referenced issue there
            issue = self.tracker.ensure_issue(self.number, title=run.description or run.experiment_id,
                                              body=f"Experiment `{run.experiment_id}` (script "
                                                   f"`{run.script}`).")
        self._labels = set(issue.labels)
        self._issue_checked = True

    def _write_comment(self, run: RunView, body: str) -> None:
        if self._comment_id is not None:
            try:
                self.tracker.edit_comment(self.number, self._comment_id, body)
                return
            except TrackerNotFound:
                self._comment_id = None  # deleted by someone: find or create it again
        tag = marker(run.experiment_id, run.prefix)

        def find_or_create() -> tuple[int, bool]:
            for comment in self.tracker.list_comments(self.number):
                if comment.body.startswith(tag):
                    return comment.id, False
            created = self.tracker.create_comment(self.number, body).id
            # Two executors of one experiment starting together may both have created the comment: the
            # oldest one wins and the others delete their own, so every publisher ends on the same comment.
            managed = sorted(c.id for c in self.tracker.list_comments(self.number) if c.body.startswith(tag))
            oldest = managed[0] if managed else created
            if oldest != created:
                self.tracker.delete_comment(self.number, created)
            return oldest, oldest == created

        def classify(exc: BaseException) -> Transient | None:
            return Transient("tracker unavailable") if isinstance(exc, TrackerUnavailable) else None

        def give_up(exc: BaseException, why: str) -> Exception:
            return exc if isinstance(exc, Exception) else TrackerError(str(exc))

        comment_id, created = self.find_policy.run(find_or_create, classify, give_up,
                                                   abort=self.tracker.abort_event)
        self._comment_id = comment_id
        if not created:
            self.tracker.edit_comment(self.number, comment_id, body)

    def _set_labels(self, status: str) -> None:
        wanted = RUN_LABELS.get(status)
        if wanted is None or self._labels is None:
            return
        for stale in sorted(set(RUN_LABELS.values()) - {wanted}):
            if stale in self._labels:
                self._labels = set(self.tracker.remove_label(self.number, stale))
        if wanted not in self._labels:
            self._labels = set(self.tracker.add_labels(self.number, [wanted]))

    # -- inputs of the body ----------------------------------------------------------------------------------

    def _outputs(self, step: StepView) -> StepOutputs:
        if step.status not in ("SUCCESS", "FAILED", "RUNNING"):
            return StepOutputs()  # nothing written yet (WAITING, DEP_FAILED) or nothing final (PREEMPTED)
        key = (step.output_path, step.status, step.attempt)
        if key in self._outputs_cache:
            return self._outputs_cache[key]
        outputs = read_step_outputs(step.output_path, failed=step.status == "FAILED")
        if step.status in TERMINAL_STEP_STATES:  # a running step's metrics keep growing: re-read them
            self._outputs_cache[key] = outputs
        return outputs

    def _manifest(self, run: RunView) -> Mapping[str, Any]:
        return self._read(f"{run.prefix.rstrip('/')}/experiments/{run.experiment_id}.json")

    def _read(self, path: str) -> dict[str, Any]:
        """A record under experiments/ (manifest, verdicts), or {} when absent or unreadable."""
        try:
            data = jsonio.read_json(storage_for(path), path)  # None: the executor has not written it yet
        except CorruptFileError as exc:  # a damaged manifest must not stop the status from being published
            logger.warning("%s unreadable, omitted from the status comment: %s", path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def _dashboard_link(self, run: RunView) -> str | None:
        return f"{self.dashboard_url}/experiments/{run.experiment_id}" if self.dashboard_url else None
