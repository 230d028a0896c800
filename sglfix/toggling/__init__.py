"""Toggle files, the registry and SGLANG_DEBUG_REVERT_PR.

The variable's name and its "nothing selected" rule live here, in the package itself, because
engines check them in every process: reading them imports nothing else (no registry, YAML,
pydantic or inspect).
"""

from __future__ import annotations

ENV_VAR = "SGLANG_DEBUG_REVERT_PR"
# Where a toggles directory other than the profile's is named (read by the start-up hook too).
TOGGLES_ENV = "SGLFIX_TOGGLES_DIR"
# Candidate fixes (unified diffs, os.pathsep between files) applied in every process, before the
# reverts the switch selects (sglfix.toggling.candidate).
APPLY_ENV = "SGLFIX_APPLY"


def selects_nothing(value: str | None) -> bool:
    """Unset, empty or ``0``: the variable selects no revert."""
    return value is None or value.strip() in ("", "0")
