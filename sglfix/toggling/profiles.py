"""Profiles: a toggle set is written for one code base; a profile names the set and its code base.

``reproduction`` (the default) is ``toggles/``, written against ``sglfix.backends``, the
reproduction the harness replays. ``sglang-0.5.23`` is ``profiles/sglang-0.5.23/``, written
against real sglang 0.5.23, whose scenarios the harness replays through the installed sglang
(``codebase``; its built-in scenarios are ``profiles/sglang-0.5.23/scenarios/``). ``--profile NAME`` on the command line and ``SGLFIX_PROFILE`` in
the environment select one; ``--toggles DIR`` / ``SGLFIX_TOGGLES_DIR`` name a directory instead.

Imports nothing heavy: the start-up hook reads this before it loads any toggle file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DEFAULT_PROFILE", "PROFILES", "PROFILE_ENV", "Profile", "current_profile", "get_profile"]

PROFILE_ENV = "SGLFIX_PROFILE"
DEFAULT_PROFILE = "reproduction"


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    package: str  # the package that holds the toggle files
    subdir: str = ""
    # The engine's own reader of SGLANG_DEBUG_REVERT_PR. While sglfix applies the variable in a
    # process, that function must neither apply its own (possibly dead) reverts again nor choke
    # on a comma list: its code is replaced, so callers that bound it by name get the new code.
    engine_toggle: str | None = None
    # Where the profile's code base comes from, for `doctor --source` and the network test.
    source: str = ""
    # The code base the harness replays this profile's scenarios through (sglfix.codebases).
    codebase: str = "reproduction"
    # The package holding the profile's built-in scenario files, and its subdirectory.
    scenarios_package: str = "sglfix.scenarios"
    scenarios_subdir: str = ""

    @property
    def toggles_dir(self) -> str:
        return _in_package(self.package, self.subdir)

    # A list of confirmed upstream divergences the gate accepts (sglfix.execution.known), if any.
    known_subdir: str = ""

    @property
    def known_file(self) -> str | None:
        if not self.known_subdir:
            return None
        return _in_package(self.package, self.known_subdir)

    @property
    def scenarios_dir(self) -> str:
        return _in_package(self.scenarios_package, self.scenarios_subdir)


def _in_package(package: str, sub: str) -> str:
    """A path inside an installed sglfix package (data files live beside its modules). Found
    with ``find_spec``, not importlib.resources: the start-up hook asks in every process."""
    from sglfix.common.codebase import package_dir

    root = package_dir(package)
    if root is None:
        from importlib.resources import files

        root = str(files(package))
    return os.path.join(root, sub) if sub else root


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name=DEFAULT_PROFILE,
            summary="the reproduction under sglfix.backends (what the harness replays)",
            package="sglfix.toggles",
        ),
        Profile(
            name="sglang-0.5.23",
            summary="real sglang 0.5.23: the five seed fixes and sglang's own six reverts",
            package="sglfix.profiles",
            subdir="sglang-0.5.23",
            engine_toggle="sglang.srt.debug_utils.pr_fix_toggle.maybe_revert_pr_fix",
            source="sglang==0.5.23",
            codebase="sglang-0.5.23",
            scenarios_package="sglfix.profiles",
            scenarios_subdir="sglang-0.5.23/scenarios",
            known_subdir="sglang-0.5.23/known/divergences.yaml",
        ),
    )
}


def get_profile(name: str, *, what: str = "--profile") -> Profile:
    profile = PROFILES.get(name.strip())
    if profile is None:
        from sglfix.common.errors import ConfigError
        from sglfix.common.schema import nearest

        raise ConfigError(f"{what}: no profile {name!r}{nearest(name, PROFILES)}; profiles: {', '.join(PROFILES)}")
    return profile


def current_profile() -> Profile:
    """The profile ``SGLFIX_PROFILE`` names (unset or empty: the reproduction)."""
    name = os.environ.get(PROFILE_ENV, "").strip()
    return get_profile(name, what=PROFILE_ENV) if name else PROFILES[DEFAULT_PROFILE]


@dataclass(frozen=True)
class Choice:
    """Which profile applies ``SGLANG_DEBUG_REVERT_PR`` in this process, and why.

    ``profile`` is None while the choice waits for the process to import one of the code bases:
    ``candidates`` maps each watched top-level module to the profile its import selects."""

    profile: Profile | None
    why: str
    candidates: tuple[tuple[str, Profile], ...] = ()


def _installed_profiles() -> tuple[list[tuple[str, Profile]], list[str]]:
    """(module, profile) for each engine code base installed in a version a profile is written
    for, and notes on those installed in a version no profile covers. Imports no engine."""
    from sglfix.codebases import get_codebase, installed

    found: list[tuple[str, Profile]] = []
    notes: list[str] = []
    seen: set[str] = set()
    for profile in PROFILES.values():
        cb = get_codebase(profile.codebase)
        if cb.distribution is None or cb.package in seen:
            continue
        here = installed(cb)
        if here is None:
            continue
        match = [
            p
            for p in PROFILES.values()
            if get_codebase(p.codebase).package == cb.package and get_codebase(p.codebase).version == here.version
        ]
        seen.add(cb.package)
        if match:
            found.append((cb.package, match[0]))
        else:
            notes.append(f"{cb.package} {here.version} is installed but no profile is written for it")
    return found, notes


def choose_profile() -> Choice:
    """``SGLFIX_PROFILE`` when set; else the profile of the code base this process imports: an
    installed engine of a version a profile is written for, or the reproduction. When neither is
    imported yet, the first import of one decides (``Choice.profile`` None)."""
    import sys

    from sglfix.codebases import REPRODUCTION

    name = os.environ.get(PROFILE_ENV, "").strip()
    if name:
        return Choice(get_profile(name, what=PROFILE_ENV), f"{PROFILE_ENV}={name}")
    default = PROFILES[DEFAULT_PROFILE]
    engines, notes = _installed_profiles()
    if not engines:
        why = "; ".join(notes) if notes else "no engine with a profile is installed"
        return Choice(default, f"{PROFILE_ENV} is unset and {why}: the reproduction")
    for module, profile in engines:
        if module in sys.modules:
            return Choice(
                profile, f"{PROFILE_ENV} is unset and this process imported {module} {get_codebase_version(profile)}"
            )
    if REPRODUCTION.package in sys.modules:
        return Choice(default, f"{PROFILE_ENV} is unset and this process imported {REPRODUCTION.package}")
    shown = ", ".join(f"{m} -> {p.name}" for m, p in engines)
    return Choice(
        None,
        f"{PROFILE_ENV} is unset: the first of these imports decides ({shown}, "
        f"{REPRODUCTION.package} -> {DEFAULT_PROFILE})",
        candidates=(*engines, (REPRODUCTION.package, default)),
    )


def get_codebase_version(profile: Profile) -> str:
    from sglfix.codebases import get_codebase

    return get_codebase(profile.codebase).version or ""
