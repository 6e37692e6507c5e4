"""Training FLOPs per token of a train step, for the compare view's FLOPs axis (marin/compare/curves.py).

A run recorded since FLOPs were logged carries `flops_per_token` in its train_result.json: the trainer's
count, written when the run ended. For a run recorded before, the same count is derived from the step's
recorded config. The step's config class (`config_class` in its .marin/step.json: the import path the engine
recorded when it ran the step) may define

    @staticmethod
    def flops_per_token_from_config(train_config: dict) -> float

taking the step's train_config.json (the trainer's whole config as it ran) and returning what the trainer
would have logged. operators/train.py's `TrainConfig` does, with the trainer's own function
(`moe_trainer.metrics.train_flops_per_token` of the recorded model and sequence length): one implementation,
at record time and after. The engine knows no models; it only calls what the step's config class offers, and
the chart states which runs' FLOPs were derived this way.

A run whose records give neither has no curve on the FLOPs axis, and the reason is stated (no config class
recorded, a class that offers no derivation, an import or a derivation that failed, with its error).

The class is imported by its recorded path, as a worker imports a step's function to run it: the engine
already requires both to be importable without side effects (experiment scripts run under `if __name__ ==
"__main__"`). It happens once per class and process, and only for a run without logged FLOPs on this axis
(operators.train imports the trainer, and with it JAX: a few seconds, once).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marin.compare.runs import StepRef
from marin.compare.source import Source, number

DERIVE = "flops_per_token_from_config"
NOT_LOGGED = "no flops_per_token in train_result.json"


@dataclass(frozen=True)
class FlopsPerToken:
    value: float | None
    derived: bool = False  # computed from train_config.json, not logged by the run
    why: str = ""  # why there is no value


@functools.lru_cache(maxsize=64)
def _deriver(config_class: str) -> tuple[Callable[[dict[str, Any]], Any] | None, str]:
    """The derivation `config_class` ('module:Qual.Name') offers, or None and why (imported once per path)."""
    module, _, qualname = config_class.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception as e:  # reported in the chart, never raised: a record may name a class gone since
        return None, f"{config_class} cannot be imported to derive it ({type(e).__name__}: {e})"
    derive = getattr(found, DERIVE, None)
    if not callable(derive):
        return None, f"{config_class} defines no {DERIVE} to derive it from train_config.json"
    return derive, ""


def flops_per_token(source: Source, ref: StepRef, train_config: dict[str, Any]) -> FlopsPerToken:
    """The step's training FLOPs per token: logged in train_result.json, else derived (module docstring)."""
    result = source.read_json(f"{ref.rel}/train_result.json")
    logged = number(result.get("flops_per_token")) if isinstance(result, dict) else None
    if logged is not None:
        return FlopsPerToken(logged)
    step = source.read_json(f"{ref.rel}/.marin/step.json")
    config_class = step.get("config_class") if isinstance(step, dict) else None
    if not isinstance(config_class, str) or ":" not in config_class:
        return FlopsPerToken(None, why=f"{NOT_LOGGED}, and no config_class in .marin/step.json to derive it")
    derive, why = _deriver(config_class)
    if derive is None:
        return FlopsPerToken(None, why=f"{NOT_LOGGED}, and {why}")
    try:
        value = number(derive(train_config))
    except Exception as e:  # a record the class cannot read (an older format): stated in the chart
        return FlopsPerToken(None, why=f"{NOT_LOGGED}, and {config_class}.{DERIVE} failed on "
                                       f"train_config.json ({type(e).__name__}: {e})")
    if value is None or value <= 0:
        return FlopsPerToken(None, why=f"{NOT_LOGGED}, and {config_class}.{DERIVE} gave {value!r}")
    return FlopsPerToken(value, derived=True)
