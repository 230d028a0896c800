"""Per-version variants of a toggle part: where the engine's code moved between the releases a
profile covers, a part carries the patches for those releases, or says why it cannot apply there.

A part's own ``patches`` are written for the profile's version (the newest it covers). Each
variant names a range of the distribution's versions (PEP 440 specifiers) and either the
patches that revert the same fix in that code (``sglfix toggle port`` writes them) or ``absent``:
why no revert of that fix exists there (the release predates the fix, so its code already is the
pre-fix code; the function it touched does not exist yet). The first variant whose range holds
the installed version is the one used; none: the part's own patches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, model_validator

from sglfix.common.errors import ConfigError
from sglfix.common.schema import NodeError, StrictModel, describe_kind
from sglfix.patching.types import PatchList, PatchSpec

__all__ = ["VARIANTS_DIR", "Chosen", "VariantFile", "VariantsFile", "choose_variant", "read_variants", "version_range"]

# Beside the toggle files: ``variants/<pr>.yaml``, what ``sglfix toggle port --write`` writes.
VARIANTS_DIR = "variants"


def _specifier_text(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise NodeError(f"must be a version range like '>=0.5.18,<0.5.22'; got {describe_kind(value)}")
    try:
        version_range(value)
    except ConfigError as exc:
        raise NodeError(str(exc)) from None
    return value.strip()


class VariantFile(StrictModel):
    """``variants[]`` of a part: the releases ``versions`` names get ``patches``, or none (``absent``)."""

    versions: Annotated[str, BeforeValidator(_specifier_text)]
    patches: PatchList | None = None
    absent: str | None = None
    # The version whose patches these were re-anchored from (``sglfix toggle port``), for the reader.
    ported_from: str = ""
    # For the reader: why a hand-written variant reads as it does (what moved in that code).
    note: str = ""

    @model_validator(mode="after")
    def _patches_or_absent(self) -> VariantFile:
        if (self.patches is None) == (self.absent is None or not self.absent.strip()):
            raise NodeError("a variant needs exactly one of 'patches' (the revert there) or 'absent' (why none exists)")
        return self


class VariantsFile(StrictModel):
    """``variants/<pr>.yaml``: per part name (``main`` for a toggle of one part), its variants."""

    pr: int
    parts: dict[str, tuple[VariantFile, ...]]


def read_variants(toggle_path: str, *, pr: int, parts: list[str]) -> dict[str, tuple[VariantFile, ...]]:
    """The variants ``variants/<stem>.yaml`` beside the toggle file gives each part (none: {})."""
    import os

    from sglfix.common.schema import validate_node
    from sglfix.common.yamlio import load_yaml, read_text_file

    folder, name = os.path.split(toggle_path)
    path = os.path.join(folder, VARIANTS_DIR, name)
    if not os.path.isfile(path):
        return {}
    raw = load_yaml(read_text_file(path, what="variants file"), source=path)
    file = validate_node(VariantsFile, raw, where=path, root="variants file")
    if file.pr != pr:
        raise ConfigError(f"{path}: pr {file.pr} is not the toggle's ({pr}); rename one")
    unknown = [n for n in file.parts if n not in parts]
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]!r} is not a part of {pr}; parts: {', '.join(parts)}")
    return dict(file.parts)


@dataclass(frozen=True)
class Chosen:
    """What a part is at one version: its patches, the variant's range (None: the part's own
    patches) and, when no revert exists there, why (``absent``)."""

    patches: tuple[PatchSpec, ...]
    versions: str | None = None
    absent: str | None = None


def version_range(text: str) -> Any:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(text, prereleases=True)
    except InvalidSpecifier as exc:
        raise ConfigError(f"{text!r} is not a version range ({exc})") from None
    if _holds_nothing(spec):
        raise ConfigError(f"{text!r} is a range no version is in (its bounds cross); give one like '>=0.5.18,<0.5.22'")
    return spec


def _holds_nothing(spec: Any) -> bool:
    """Whether the bounds of ``spec`` cross (``>=2.0,<1.0``): a range that can never be
    chosen is a mistake, not a variant. ``!=`` and arbitrary equality are left alone."""
    from packaging.version import InvalidVersion, Version

    lower: tuple[Any, bool] | None = None  # (version, inclusive)
    upper: tuple[Any, bool] | None = None
    for s in spec:
        text = s.version
        if text.endswith(".*") or s.operator in ("!=", "==="):
            continue
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        bounds = {
            ">=": [("lo", True)],
            ">": [("lo", False)],
            "<=": [("hi", True)],
            "<": [("hi", False)],
            "==": [("lo", True), ("hi", True)],
            "~=": [("lo", True)],
        }.get(s.operator, [])
        for side, inclusive in bounds:
            if side == "lo" and (lower is None or (v, not inclusive) > (lower[0], not lower[1])):
                lower = (v, inclusive)
            if side == "hi" and (upper is None or (v, inclusive) < (upper[0], upper[1])):
                upper = (v, inclusive)
    if lower is None or upper is None:
        return False
    return lower[0] > upper[0] or (lower[0] == upper[0] and not (lower[1] and upper[1]))


def choose_variant(own: tuple[PatchSpec, ...], variants: tuple[VariantFile, ...], *, version: str | None) -> Chosen:
    """The part at ``version`` (None: a code base without versions, the part's own patches)."""
    if version is not None:
        from packaging.version import InvalidVersion, Version

        try:
            here = Version(version)
        except InvalidVersion:
            here = None
        for v in variants if here is not None else ():
            if here in version_range(v.versions):
                return Chosen(patches=v.patches or (), versions=v.versions, absent=v.absent)
    return Chosen(patches=own)
