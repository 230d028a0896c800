"""Scenarios: concrete batches to replay through a backend (models, loader, limits)."""

from sglfix.scenario.loader import (
    BACKENDS,
    DTYPES,
    MODES,
    ModelShape,
    Scenario,
    SpecShape,
    builtin_scenario_dir,
    load_scenario_file,
    load_scenarios,
    select_scenarios,
)

__all__ = ["BACKENDS", "DTYPES", "MODES", "ModelShape", "Scenario", "SpecShape", "builtin_scenario_dir",
           "load_scenario_file", "load_scenarios", "select_scenarios"]
