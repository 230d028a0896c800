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

__all__ = ["PROFILE_ENV", "DEFAULT_PROFILE", "Profile", "PROFILES", "get_profile", "current_profile"]

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
        from importlib.resources import files

        root = files(self.package)
        return str(root / self.subdir if self.subdir else root)

    @property
    def scenarios_dir(self) -> str:
        from importlib.resources import files

        root = files(self.scenarios_package)
        return str(root / self.scenarios_subdir if self.scenarios_subdir else root)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(name=DEFAULT_PROFILE, summary="the reproduction under sglfix.backends (what the harness replays)",
                package="sglfix.toggles"),
        Profile(name="sglang-0.5.23", summary="real sglang 0.5.23: the five seed fixes and sglang's own six reverts",
                package="sglfix.profiles", subdir="sglang-0.5.23",
                engine_toggle="sglang.srt.debug_utils.pr_fix_toggle.maybe_revert_pr_fix",
                source="sglang==0.5.23", codebase="sglang-0.5.23", scenarios_package="sglfix.profiles",
                scenarios_subdir="sglang-0.5.23/scenarios"),
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
