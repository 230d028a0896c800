"""A profile's known divergences: baseline findings on the real engine, confirmed as upstream bugs.

A baseline that fails on real code is a finding, never tuned away: the scenario stays built in,
its cells show their figures, and the divergence is listed here with the command that reproduces
it, so that the matrix gate passes with the list and fails on anything new. An entry matches the
cells of its scenarios (glob) whose verdict it names, under every toggle set (a toggle that leaves
the bug in place gives the same verdict); an entry whose scenarios all pass is reported, not
failed: the bug may have been fixed. ``device`` (``any``, ``cpu``, ``cuda``) limits an entry to the
cells of one device: a bug only a kernel shows is not expected where the kernel cannot run.
This module loads and checks the list; what a cell showing an entry means (``known``, for run,
matrix, bisect and every report alike) is decided in ``sglfix.report.outcome``.

    known_divergences:
      - scenario: probe-req-to-token-tree-ps1
        verdict: [INVARIANT]
        reason: ...
        reproduce: sglfix run --profile PROFILE -s probe-req-to-token-tree-ps1 --device cpu
        device: any
        versions: "<0.5.16"
        cleared_by: fixes/req-to-token-headroom-ps1.patch

``cleared_by`` names a candidate fix kept with the profile (a unified diff against the engine, path
relative to the profile's folder) that clears the entry: ``run --apply`` shows it doing so, and the
entry stays in the list until the engine ships the fix.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from sglfix.common.errors import ConfigError
from sglfix.common.schema import StrictModel, validate_node
from sglfix.common.verdicts import Verdict

__all__ = ["KnownDivergence", "fix_check", "fix_path", "known_of", "load_known"]


def _verdicts(value: Any) -> Any:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError("must be a verdict or a non-empty list of verdicts")
    return tuple(Verdict(v) for v in items)


class KnownDivergence(StrictModel):
    scenario: str
    verdict: Annotated[tuple[Verdict, ...], BeforeValidator(_verdicts)]
    reason: str
    reproduce: str
    device: Literal["any", "cpu", "cuda"] = "any"
    versions: Annotated[str, BeforeValidator(_range)] = ""
    cleared_by: str = ""  # a candidate fix of the profile's folder that clears it

    def holds_for(self, version: str | None) -> bool:
        """Whether the engine at ``version`` has this bug (an unknown version: every entry)."""
        if not self.versions or version is None:
            return True
        from packaging.version import InvalidVersion, Version

        from sglfix.toggling.variants import version_range

        try:
            return Version(version) in version_range(self.versions)
        except InvalidVersion:
            return True


class KnownFile(StrictModel):
    known_divergences: list[KnownDivergence]


def _range(value: Any) -> Any:
    from sglfix.toggling.variants import version_range

    if not isinstance(value, str):
        raise ValueError("must be a version range like '<0.5.16'")
    if value.strip():
        version_range(value)  # one line naming the range when it is not one
    return value.strip()


def known_of(profile: Any) -> list[KnownDivergence]:
    """The profile's known divergences that hold for the engine version installed for it."""
    from sglfix.codebases.records import engine_version

    entries = load_known(profile.known_file)
    for i, k in enumerate(entries):
        if k.cleared_by and not os.path.isfile(fix_path(profile, k.cleared_by)):
            raise ConfigError(
                f"{profile.known_file}: known_divergences[{i}].cleared_by {k.cleared_by}: no such file (looked for "
                f"{fix_path(profile, k.cleared_by)}); give the fix's path relative to the profile's folder"
            )
    if not entries or profile.is_reproduction:
        return entries
    version = engine_version(profile.toggles_dir)
    return [k for k in entries if k.holds_for(version)]


def load_known(path: str | None) -> list[KnownDivergence]:
    """The entries of ``path`` (none when the profile has no list); a bad file is one line."""
    if not path or not os.path.isfile(path):
        return []
    from sglfix.common.yamlio import load_yaml, read_text_file

    node = load_yaml(read_text_file(path, what="known-divergences file"), source=path)
    if not isinstance(node, dict):
        raise ConfigError(f"{path}:1: a known-divergences file is a mapping with the key known_divergences")
    return list(validate_node(KnownFile, node, where=path, root="known-divergences file").known_divergences)


def fix_path(profile: Any, cleared_by: str) -> str:
    """Where a known divergence's ``cleared_by`` fix lies: relative to the profile's folder."""
    return os.path.normpath(os.path.join(profile.folder, cleared_by))


def fix_check(profile: Any) -> list:
    """Each candidate fix the profile keeps for a known divergence (``cleared_by``) still applies to
    the installed code base, as ``run --apply`` would apply it."""
    from sglfix.codebases.records import engine_version
    from sglfix.common.errors import SglfixError
    from sglfix.toggling.candidate import load_candidate
    from sglfix.toggling.doctor import CheckResult

    version = None if profile.is_reproduction else engine_version(profile.toggles_dir)
    out = []
    for k in known_of(profile):
        if not k.cleared_by:
            continue
        if version is not None and version != profile.version:
            # A fix is a diff against the release the profile is written for; another release's
            # code around it differs, and the entry may not even hold there.
            out.append(
                CheckResult(
                    id=f"fix {k.cleared_by}",
                    ok=True,
                    absent=f"written for {profile.label}; {version} is installed: not checked",
                )
            )
            continue
        path = fix_path(profile, k.cleared_by)
        try:
            cand = load_candidate(path, codebase=profile)
        except SglfixError as exc:
            out.append(CheckResult(id=f"fix {k.cleared_by}", ok=False, error=str(exc).splitlines()[0]))
            continue
        out.append(CheckResult(id=f"fix {k.cleared_by} (clears {k.scenario})", ok=True, targets=list(cand.functions)))
    return out
