"""Marin open lab: content-addressed experiment steps, their plan, and the executor that runs them.

Experiments import only what is listed in `__all__`:

    from marin import Step, output_path_of, this_output_path, executor_main
    from marin import Criterion   # executor_main(..., hypothesis=..., criterion=Criterion(...))

Publishers (the status hook) implement `Publisher`, receive `RunView`/`StepView`, and are made per run by a
factory of `RunContext`, registered with `register_publisher_factory` or declared under the
`marin.publishers` entry point group (marin/status/publisher.py).
"""

from marin.definition.criterion import Criterion
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
from marin.execution.argv import ExecutorMainConfig
from marin.execution.main import RunResult, executor_main, run_experiment
from marin.graph.dag import identity_hash
from marin.issue_ref import IssueRef
from marin.status.publisher import Publisher, RunContext, RunView, StepView, register_publisher_factory

__all__ = [
    "Criterion",
    "ExecutorMainConfig",
    "ExperimentFailedError",
    "InfeasibleResourcesError",
    "IssueRef",
    "MarinError",
    "Publisher",
    "Resources",
    "RunContext",
    "RunResult",
    "RunView",
    "Step",
    "StepDefinitionError",
    "StepFailedError",
    "StepView",
    "StorageError",
    "executor_main",
    "identity_hash",
    "output_path_of",
    "prefix_path",
    "register_publisher_factory",
    "run_experiment",
    "runtime_field",
    "this_output_path",
]
