"""Toggle files, the registry and the engine's revert variable (``envs.REVERT_PR``).

The variable's "nothing selected" rule lives here, in the package itself, because engines check
it in every process: reading it imports nothing else (no registry, YAML, pydantic or inspect).
The names are declared in ``sglfix.common.environ``, a leaf as cheap.
"""

from __future__ import annotations

from sglfix.common.environ import envs

ENV_VAR = envs.REVERT_PR.name
# Where a toggles directory other than the profile's is named (read by the start-up hook too).
TOGGLES_ENV = envs.SGLFIX_TOGGLES_DIR.name
# Candidate fixes (unified diffs, os.pathsep between files) applied in every process, before the
# reverts the switch selects (sglfix.toggling.candidate).
APPLY_ENV = envs.SGLFIX_APPLY.name


def selects_nothing(value: str | None) -> bool:
    """Unset, empty or ``0``: the variable selects no revert."""
    return value is None or value.strip() in ("", "0")
