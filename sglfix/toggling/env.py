"""``SGLANG_DEBUG_REVERT_PR``: the production switch, parsed strictly.

One id, or a comma-separated list (``26651,27460:sizing``); empty or ``0`` selects nothing.
Anything else is a one-line error naming the bad item and listing the registered ids; nothing
is applied then. A single integer means what it means to sglang.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from sglfix.common.errors import ConfigError
from sglfix.toggling import ENV_VAR, selects_nothing
from sglfix.toggling.ids import ToggleId
from sglfix.toggling.registry import Registry, Selection, load_registry, parse_toggle_ids

__all__ = ["ENV_VAR", "maybe_revert_pr_fix", "parse_env_value", "selected_from_env"]

MAX_LEN = 1000
_applied_by_env = None  # the Reverted made by maybe_revert_pr_fix, if any


def _show(token: str, limit: int = 40) -> str:
    return repr(token if len(token) <= limit else token[:limit] + "...")


def parse_env_value(value: str | None, *, registry: Registry | None = None, what: str = ENV_VAR) -> list[Selection]:
    """The selections ``value`` names; ``what`` is how the user gave it (the variable, or an
    option that carries the same list), for the one-line error."""
    if selects_nothing(value):
        return []
    stripped = value.strip()
    registry = registry or load_registry()
    known = registry.describe_ids()
    if len(value) > MAX_LEN:
        raise ConfigError(
            f"{what} is {len(value)} characters long (limit {MAX_LEN}); set it to PR ids like 27460 "
            f"or 27460:part, comma-separated; registered: {known}"
        )
    ids: list[ToggleId] = []
    for position, token in enumerate((t.strip() for t in stripped.split(",")), start=1):
        if not token:
            raise ConfigError(
                f"{what}={_show(value)}: item {position} is empty (stray comma?); "
                f"use ids like 27460,26651:clamp; registered: {known}"
            )
        if token == "0":
            raise ConfigError(
                f"{what}: bad item {_show(token)} (item {position}): 0 means 'none' and "
                f"cannot be combined with ids; registered: {known}"
            )
        try:
            ids.append(ToggleId.parse(token, what=what))
        except ConfigError:
            raise ConfigError(
                f"{what}: bad item {_show(token)} (item {position}): expected a PR number "
                f"like 27460 or a part like 27460:sizing; registered: {known}"
            ) from None
    try:
        return parse_toggle_ids(ids, registry=registry, what=what)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if "registered:" in message else f"{message}; registered: {known}") from None


def selected_from_env(environ: dict | None = None, *, registry: Registry | None = None) -> list[Selection]:
    env = os.environ if environ is None else environ
    return parse_env_value(env.get(ENV_VAR), registry=registry)


def maybe_revert_pr_fix(*, registry: Registry | None = None, allowed_prefixes: Iterable[str] | None = None):
    """Apply what ``SGLANG_DEBUG_REVERT_PR`` selects, once per process.

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
        hook.arm(os.environ.get(ENV_VAR))
        armed.apply_all(allowed_prefixes=allowed_prefixes)
        return armed.record
    selections = selected_from_env(registry=registry)
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
