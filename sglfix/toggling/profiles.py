"""Which profile a process uses: one resolver for the CLI, the worker's parent and the start-up hook.

A profile is one record per code-base version (``sglfix.codebases.Profile``, read from the
profile folder's ``profile.toml``): its toggle files, scenarios, known divergences and the code
base they are written for. ``resolve_profile`` decides which applies: ``--profile NAME`` on the
command line, else ``SGLFIX_PROFILE`` in the environment, else (the start-up hook only) the code
base the process imports, else the reproduction. ``--toggles DIR`` / ``SGLFIX_TOGGLES_DIR`` name
a toggles directory instead of the profile's.

Imports nothing heavy: the start-up hook reads this before it loads any toggle file.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from sglfix.codebases import CODEBASES, REPRODUCTION_NAME, Profile, get_codebase, installed, profiles
from sglfix.common.environ import envs

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "PROFILE_ENV",
    "Choice",
    "Profile",
    "get_profile",
    "resolve_profile",
]

PROFILE_ENV = envs.SGLFIX_PROFILE.name
DEFAULT_PROFILE = REPRODUCTION_NAME

# Every profile found on disk, by name (sglfix.codebases.search_folders).
PROFILES: Mapping[str, Profile] = CODEBASES


@dataclass(frozen=True)
class Choice:
    """Which profile applies, and why.

    ``profile`` is None while the choice waits for the process to import one of the code bases:
    ``candidates`` maps each watched top-level module to the profile its import selects."""

    profile: Profile | None
    why: str
    candidates: tuple[tuple[str, Profile], ...] = ()


def get_profile(name: str, *, what: str = "--profile") -> Profile:
    """The profile ``name`` (every record validated), or a one-line error listing the profiles."""
    return get_codebase(name, what=what, checked=True)


def resolve_profile(*, option: str | None = None, follow_imports: bool = False) -> Choice:
    """The one answer to "which profile": ``option`` (``--profile``), else ``SGLFIX_PROFILE``,
    else, with ``follow_imports`` (the start-up hook), the profile of the code base this process
    imports: an installed engine of a version a profile covers, or the reproduction; when neither
    is imported yet the first import of one decides (``Choice.profile`` None). Else the
    reproduction. The hook's form reads the records without pydantic (it must not import it);
    every other form validates them."""
    checked = not follow_imports
    if option is not None and option.strip():
        return Choice(get_codebase(option, what="--profile", checked=checked), f"--profile {option.strip()}")
    name = envs.SGLFIX_PROFILE.get()
    if name:
        return Choice(get_codebase(name, what=PROFILE_ENV, checked=checked), f"{PROFILE_ENV}={name}")
    default = get_codebase(DEFAULT_PROFILE, checked=checked)
    if not follow_imports:
        return Choice(default, f"{PROFILE_ENV} is unset: the reproduction")
    return _by_import(default)


def _installed_profiles() -> tuple[list[tuple[str, Profile]], list[str]]:
    """(module, profile) for each engine code base installed in a version a profile covers, and
    notes on those installed in a version no profile covers. Imports no engine."""
    found: list[tuple[str, Profile]] = []
    notes: list[str] = []
    engines: dict[str, list[Profile]] = {}
    for record in profiles().values():
        if not record.is_reproduction:
            engines.setdefault(record.package, []).append(record)
    for package, records in engines.items():
        here = installed(records[0])
        if here is None:
            continue
        match = [r for r in records if r.covers(here.version)]
        if match:
            found.append((package, match[0]))
        else:
            notes.append(f"{package} {here.version} is installed but no profile is written for it")
    return found, notes


def _by_import(default: Profile) -> Choice:
    engines, notes = _installed_profiles()
    if not engines:
        why = "; ".join(notes) if notes else "no engine with a profile is installed"
        return Choice(default, f"{PROFILE_ENV} is unset and {why}: the reproduction")
    for module, profile in engines:
        if module in sys.modules:
            return Choice(profile, f"{PROFILE_ENV} is unset and this process imported {module} {profile.version}")
    if default.package in sys.modules:
        return Choice(default, f"{PROFILE_ENV} is unset and this process imported {default.package}")
    shown = ", ".join(f"{m} -> {p.name}" for m, p in engines)
    return Choice(
        None,
        f"{PROFILE_ENV} is unset: the first of these imports decides ({shown}, {default.package} -> {default.name})",
        candidates=(*engines, (default.package, default)),
    )
