"""Marin open lab: content-addressed experiment steps, their plan, and the executor that runs them.

Experiments import only what is listed in `__all__`:

    from marin import Step, output_path_of, this_output_path, executor_main
"""

from marin.definition.placeholders import output_path_of, prefix_path, runtime_field, this_output_path
from marin.definition.step import Resources, Step
from marin.errors import (
    ExperimentFailedError,
    InfeasibleResourcesError,
    MarinError,
    StepDefinitionError,
    StepFailedError,
    StorageError,
)
from marin.execution.main import ExecutorMainConfig, RunResult, executor_main, run_experiment
from marin.issue_ref import IssueRef

__all__ = [
    "ExecutorMainConfig",
    "ExperimentFailedError",
    "InfeasibleResourcesError",
    "IssueRef",
    "MarinError",
    "Resources",
    "RunResult",
    "Step",
    "StepDefinitionError",
    "StepFailedError",
    "StorageError",
    "executor_main",
    "output_path_of",
    "prefix_path",
    "run_experiment",
    "runtime_field",
    "this_output_path",
]
