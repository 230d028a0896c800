"""The engine's revert variable (``envs.REVERT_PR``): the production switch, applied once per process.

The value is parsed strictly (``sglfix.toggling.envvalue``); a bad one is a one-line error and
nothing is applied then.
"""

from __future__ import annotations

from collections.abc import Iterable

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.toggling import ENV_VAR
from sglfix.toggling.envvalue import parse_env_value, selected_from_env
from sglfix.toggling.registry import Registry

# The parser's names stay here too: the command line and the pytest plugin take the switch's
# parser from the switch.
__all__ = ["ENV_VAR", "maybe_revert_pr_fix", "parse_env_value", "selected_from_env"]

_applied_by_env = None  # the Reverted made by maybe_revert_pr_fix, if any


def maybe_revert_pr_fix(
    *,
    registry: Registry | None = None,
    allowed_prefixes: Iterable[str] | None = None,
    expected: dict[str, str] | None = None,
):
    """Apply what ``REVERT_PR`` selects, once per process, on top of the candidate
    fixes ``SGLFIX_APPLY`` names (``expected``: their ids and the sha256 the files must have).

    Calling it again with the same selection is a no-op (engines call it from several
    entry points); a different selection while one is applied is an error.
    """
    global _applied_by_env
    from sglfix.toggling import hook
    from sglfix.toggling.revert import revert

    armed = hook.decide_now()
    if armed is not None:
        # The start-up hook applies the variable in this process: same value, then import and
        # revert now whatever is still waiting for its module; another value is an error.
        hook.arm(envs.REVERT_PR.get())
        armed.apply_all(allowed_prefixes=allowed_prefixes)
        return armed.record
    selections = [*_candidates(expected), *selected_from_env(registry=registry)]
    wanted = [s.id for s in selections]
    if _applied_by_env is not None and not _applied_by_env.restored:
        if _applied_by_env.ids == wanted:
            return _applied_by_env
        raise ConfigError(
            f"{ENV_VAR} now selects {','.join(wanted) or 'nothing'} but {','.join(_applied_by_env.ids)} "
            "is already reverted in this process; restore it first"
        )
    if not selections:
        return None
    _applied_by_env = revert(selections, allowed_prefixes=allowed_prefixes, what=ENV_VAR)
    return _applied_by_env


def _candidates(expected: dict[str, str] | None) -> list:
    """The candidate fixes ``SGLFIX_APPLY`` names, for the code base this process replays."""
    from sglfix.toggling.candidate import from_env

    value = envs.SGLFIX_APPLY.get()
    if value is None or not value.strip():
        return []
    from sglfix.codebases import active

    return from_env(value, codebase=active(), expected=expected)
