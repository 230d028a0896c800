"""What ``REVERT_PR`` selects, parsed strictly.

One id, or a comma-separated list (``26651,27460:sizing``); empty or ``0`` selects nothing.
Anything else is a one-line error naming the bad item and listing the registered ids; nothing
is applied then. A single integer means what it means to sglang.

A leaf under the switch: the start-up hook validates with it before anything is applied, and
``sglfix.toggling.env`` applies what it selects through the hook.
"""

from __future__ import annotations

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.toggling import ENV_VAR, selects_nothing
from sglfix.toggling.ids import ToggleId
from sglfix.toggling.registry import Registry, Selection, load_registry, parse_toggle_ids

__all__ = ["MAX_LEN", "parse_env_value", "selected_from_env"]

MAX_LEN = 1000


def _show(token: str, limit: int = 40) -> str:
    return repr(token if len(token) <= limit else token[:limit] + "...")


def parse_env_value(value: str | None, *, registry: Registry | None = None, what: str = ENV_VAR) -> list[Selection]:
    """The selections ``value`` names; ``what`` is how the user gave it (the variable, or an
    option that carries the same list), for the one-line error."""
    if value is None or selects_nothing(value):
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
        selections = parse_toggle_ids(ids, registry=registry, what=what)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if "registered:" in message else f"{message}; registered: {known}") from None
    absent = registry.absent(s.id for s in selections)
    if absent:
        # Reverting a fix the installed release predates would silently do nothing.
        raise ConfigError(f"{what}={_show(value)}: {next(iter(absent.values()))}; leave it out")
    return selections


def selected_from_env(environ: dict | None = None, *, registry: Registry | None = None) -> list[Selection]:
    return parse_env_value(envs.REVERT_PR.get(env=environ), registry=registry)
