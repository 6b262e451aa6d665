"""Scenarios: the one configuration object that drives both the twin and the executor."""

from scenarios.distributions import LengthDist
from scenarios.loader import DEFAULT_SCENARIO, ScenarioError, bundled, load, validate
from scenarios.schema import DLRMModel, GEMModel, Scenario, TableFamily

__all__ = [
    "DEFAULT_SCENARIO",
    "DLRMModel",
    "GEMModel",
    "LengthDist",
    "Scenario",
    "ScenarioError",
    "TableFamily",
    "bundled",
    "load",
    "validate",
]
