"""Shell completion for the values a user would otherwise look up: toggle ids, scenario names,
profile names. Each completer reads the same files the command would (the profile and
``--toggles`` given earlier on the line count) and offers nothing rather than fail: a broken
toggle file is reported when the command runs, not in the middle of a Tab press."""

from __future__ import annotations

from typing import Any

from sglfix.cli.context import Options


def _options(ctx: Any) -> Options:
    params = ctx.find_root().params
    opts = Options(toggles=params.get("toggles") or None)
    if params.get("profile"):
        from sglfix.toggling.profiles import get_profile

        opts.profile = get_profile(params["profile"])
        opts.toggles = opts.profile.toggles_dir
    return opts


def _matching(values: list[str], incomplete: str) -> list[str]:
    # --revert takes comma lists: complete the item after the last comma.
    head, sep, last = incomplete.rpartition(",")
    prefix = head + sep
    return [prefix + v for v in values if v.startswith(last)]


def toggle_ids(ctx: Any, incomplete: str) -> list[str]:
    try:
        return _matching(_options(ctx).registry().ids(parts=True), incomplete)
    except Exception:
        return []


def scenario_names(ctx: Any, incomplete: str) -> list[str]:
    try:
        from sglfix.scenario import load_scenarios

        profile = _options(ctx).active_profile()
        return [s.name for s in load_scenarios(builtin_dir=profile.scenarios_dir) if s.name.startswith(incomplete)]
    except Exception:
        return []


def profile_names(incomplete: str) -> list[str]:
    from sglfix.toggling.profiles import PROFILES

    return [name for name in PROFILES if name.startswith(incomplete)]
