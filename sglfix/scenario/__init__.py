"""Scenarios: concrete batches to replay through a backend (models, mode table, limits, memory, loader)."""

from sglfix.scenario.limits import LIMITS, limits_markdown
from sglfix.scenario.loader import builtin_scenario_dir, load_scenario_file, load_scenarios, select_scenarios
from sglfix.scenario.memory import (
    DEFAULT_MEMORY_BUDGET,
    MEMORY_BUDGET_ENV,
    MemoryEstimate,
    check_memory,
    estimate_memory,
    memory_budget,
    parse_size,
)
from sglfix.scenario.models import BACKENDS, DTYPES, ModelShape, Scenario, SpecShape
from sglfix.scenario.modes import MODE_RULES, MODES

__all__ = [
    "BACKENDS",
    "DEFAULT_MEMORY_BUDGET",
    "DTYPES",
    "LIMITS",
    "MEMORY_BUDGET_ENV",
    "MODES",
    "MODE_RULES",
    "MemoryEstimate",
    "ModelShape",
    "Scenario",
    "SpecShape",
    "builtin_scenario_dir",
    "check_memory",
    "estimate_memory",
    "limits_markdown",
    "load_scenario_file",
    "load_scenarios",
    "memory_budget",
    "parse_size",
    "select_scenarios",
]
