"""Pydantic response models of the dashboard's JSON API (they are what FastAPI's OpenAPI schema documents).

Field names follow docs/formats.md; times are Unix seconds. Models that mirror a file written by another
component (status.json, an event) allow extra fields, so a newer writer does not break an older dashboard.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

STATES = ("WAITING", "RUNNING", "SUCCESS", "FAILED", "DEP_FAILED", "PREEMPTED")


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="allow")
    run_id: str | None = None
    started: float | None = None
    ended: float | None = None
    status: str | None = None
    user: str | None = None
    args: list[Any] = Field(default_factory=list)
    publisher_errors: list[Any] = Field(default_factory=list)


class IssueLink(BaseModel):
    ref: str = Field(description="the issue reference as recorded, e.g. 'owner/repo#12'")
    url: str | None = Field(
        default=None, description="where to read it: the dashboard's own page for local issues"
    )
    local: bool = False


class HeadlineMetric(BaseModel):
    name: str = Field(description="`STEP:PATH`, e.g. `eval/tiny_moe:macro.bpb`")
    value: float
    stderr: float | None = None


class ExperimentSummary(BaseModel):
    id: str = Field(description="manifest file stem: '{script stem}-{hash8}'")
    script: str | None = None
    description: str = ""
    issue: IssueLink | None = None
    user: str | None = None
    host: str | None = None
    git_commit: str | None = None
    created: float | None = None
    updated: float | None = None
    state: str = Field(description="status of the latest run (RUNNING, SUCCESS, FAILED) or NEVER_RUN")
    n_steps: int = 0
    n_runs: int = 0
    last_run: RunSummary | None = None
    verdict: str | None = Field(default=None, description="the current verdict's outcome (docs/notebook.md)")
    headline: list[HeadlineMetric] = Field(
        default_factory=list, description="the verdict's measured values, else the own eval steps' main "
                                          "metrics (marin.compare.headline)")


class ExperimentList(BaseModel):
    total: int = Field(description="experiments matching the filters")
    offset: int
    limit: int
    items: list[ExperimentSummary]
    state_counts: dict[str, int] = Field(
        description="experiments per state among those matching the other filters"
    )
    problems: list[str] = Field(default_factory=list, description="manifests that could not be read, and why")


class StepError(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    dependency: str | None = None


class StepRef(BaseModel):
    name: str
    hash: str
    path: str = Field(
        description="the step's output path relative to the prefix (use it in /api/steps/{path})"
    )
    status: str = Field(description="status.json's status, or NOT_STARTED when the step has no status yet")
    attempt: int | None = None
    started: float | None = None
    ended: float | None = None
    duration: float | None = None
    error: StepError | None = None
    dependencies: list[str] = Field(default_factory=list, description="hashes of the steps this one reads")


class DagNode(BaseModel):
    hash: str
    name: str
    path: str
    status: str
    layer: int
    x: float
    y: float


class DagEdge(BaseModel):
    source: str
    target: str
    d: str = Field(description="SVG path data of the edge")


class Dag(BaseModel):
    width: float
    height: float
    node_width: float
    node_height: float
    nodes: list[DagNode]
    edges: list[DagEdge]


class ResultValue(BaseModel):
    metric: str = Field(description="marin.compare's key: `eval:macro.bpb`, `choices:TASK.acc`, `train:loss`")
    value: float
    stderr: float | None = None


class StepResult(BaseModel):
    name: str
    path: str
    values: list[ResultValue]


class ExperimentDetail(ExperimentSummary):
    script_args: list[Any] = Field(default_factory=list)
    runs: list[RunSummary] = Field(default_factory=list)
    steps: list[StepRef] = Field(default_factory=list)
    step_counts: dict[str, int] = Field(default_factory=dict)
    dag: Dag
    active: bool = Field(description="true while a step is WAITING or RUNNING or the latest run is RUNNING")
    baseline: str | None = Field(default=None, description="the experiment it is compared with by default "
                                                          "(marin.compare.runs.baseline_of)")
    results: list[StepResult] = Field(default_factory=list, description="its own steps' final and eval "
                                                                        "metrics")
    problems: list[str] = Field(
        default_factory=list,
        description="state files of its steps that cannot be read: the path and the fix")


class StepStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    hash: str | None = None
    status: str = "NOT_STARTED"
    attempt: int | None = None
    run_id: str | None = None
    executor: str | None = None
    created: float | None = None
    updated: float | None = None
    started: float | None = None
    ended: float | None = None
    error: StepError | None = None
    log: str | None = None


class StepEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    ts: float | None = None
    event: str = ""
    attempt: int | None = None
    run_id: str | None = None
    executor: str | None = None
    message: str | None = None
    previous_owner: str | None = None


class Attempt(BaseModel):
    attempt: int
    started: float | None = None
    ended: float | None = None
    outcome: str | None = Field(
        default=None, description="the last event of this attempt (SUCCESS, FAILED, PREEMPTED...)"
    )
    executor: str | None = None
    log: str | None = Field(default=None, description="log path relative to the prefix")
    log_size: int | None = None


class FieldChange(BaseModel):
    field: str = Field(description="dotted field path, e.g. 'config.lr' or 'dependency tokenize/stdlib'")
    kind: str = Field(description="changed, added or removed")
    old: Any = None
    new: Any = None


class PreviousVersion(BaseModel):
    name: str
    hash: str
    path: str
    created: float | None = None


class StepChanges(BaseModel):
    previous: PreviousVersion | None = None
    changes: list[FieldChange] = Field(default_factory=list)
    note: str = Field(default="", description="a sentence explaining the result")


class StepDetail(BaseModel):
    path: str
    name: str
    hash: str | None = None
    status: StepStatus
    description: str = ""
    fn: str | None = None
    fn_source_hash: str | None = None
    version: str | None = None
    config: Any = None
    identity: Any = None
    config_class: str | None = None
    dependencies: list[StepRef] = Field(default_factory=list)
    resources: Any = None
    issue: IssueLink | None = None
    experiment: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    packages: dict[str, Any] = Field(default_factory=dict)
    host: str | None = None
    user: str | None = None
    created: float | None = None
    events: list[StepEvent] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    lease: dict[str, Any] | None = None
    changes: StepChanges
    wandb: dict[str, Any] | None = None
    interruptions: dict[str, Any] | None = Field(
        default=None, description="the step's interruption ledger (.marin/interruptions.json), if it has one")
    has_metrics: bool = False
    has_eval: bool = False
    active: bool = False
    experiments: list[str] = Field(
        default_factory=list, description="experiments naming this step, newest first"
    )
    recorded: bool = Field(
        True, description="false when the step never ran (no step.json): shown from the manifest"
    )
    problems: list[str] = Field(
        default_factory=list,
        description="its state files that cannot be read (the path and the fix) and JSONL lines skipped")


class LogTail(BaseModel):
    attempt: int | None
    path: str | None = Field(description="log path relative to the prefix; null when no log exists yet")
    size: int = Field(description="total size of the log file in bytes")
    start: int = Field(description="byte offset of the first byte of `text`")
    end: int = Field(
        description="byte offset after the last byte of `text`: pass it back as `offset` to follow"
    )
    text: str
    truncated: bool = Field(description="true when bytes before `start` were skipped")


class FileEntry(BaseModel):
    name: str
    path: str
    type: str = Field(description="file, directory or link")
    size: int | None = None
    mtime: float | None = None


class FileListing(BaseModel):
    path: str
    type: str = "directory"
    parent: str | None = None
    entries: list[FileEntry]


class FilePreview(BaseModel):
    path: str
    type: str = "file"
    parent: str | None = None
    size: int
    text: str | None = Field(description="the first bytes as UTF-8 text; null for binary files")
    truncated: bool
    binary: bool


class ExpertLoad(BaseModel):
    step: int | None
    layers: list[list[float]] = Field(
        description="per MoE layer, the fraction of tokens routed to each expert"
    )
    routing_entropy: list[float] | None = None


class EvalPoint(BaseModel):
    step: int | None
    domains: dict[str, dict[str, float | None]]


class Metrics(BaseModel):
    rows: int = Field(description="optimizer-step rows read from metrics.jsonl")
    steps: list[float | None]
    series: dict[str, list[float | None]] = Field(
        description="loss, lr, grad_norm, update_norm, ... per kept row"
    )
    downsampled: bool
    expert_load: ExpertLoad | None = None
    eval_history: list[EvalPoint] = Field(default_factory=list)
    eval: dict[str, Any] | None = Field(default=None, description="eval.json of this step, when it has one")


class IssueComment(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: Any = None
    body: str = ""
    created: float | None = None
    updated: float | None = None
    author: str | None = None


class Issue(BaseModel):
    model_config = ConfigDict(extra="allow")
    repo: str
    number: int
    ref: str
    url: str = Field(default="", description="the dashboard page of this issue")
    author: str | None = None
    title: str = ""
    body: str = ""
    state: str = "open"
    labels: list[str] = Field(default_factory=list)
    created: float | None = None
    updated: float | None = None
    comments: list[IssueComment] = Field(default_factory=list)
    experiments: list[str] = Field(
        default_factory=list, description="ids of experiments that name this issue"
    )


class IssueList(BaseModel):
    available: bool = Field(description="false when the prefix has no local tracker")
    items: list[Issue]
