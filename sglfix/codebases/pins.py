"""The packages an engine pins exactly and cannot be imported without: named before any cell.

An engine's distribution metadata pins dozens of packages with ``==`` (an sglang release: torch,
tokenizers, flashinfer ...). Most of them a CPU set-up holds in another version, or not at all,
and the engine imports fine: the README's own install does so (a CPU torch, newer tokenizers).
A few it cannot import beside another version: sglang registers its own model configurations
with transformers, so a newer transformers that already has one ("'qwen3_asr' is already used")
or an older one that lacks what sglang imports ("Try: pip install transformers -U") kills every
worker at boot. Those are the profile's ``import_pins``; for each, the version the code base
pins (its ``.dist-info/METADATA`` beside the package, a release's wheel metadata, or a source
tree's ``pyproject.toml``) is compared with the one this environment would import, read without
importing either.
"""

from __future__ import annotations

import os
from typing import Any

from sglfix.common.errors import ConfigError

__all__ = ["check_pins", "exact_pins", "pin_mismatch"]


def exact_pins(path: str, distribution: str) -> dict[str, str] | None:
    """``name -> version`` of each package the code base at ``path`` pins with ``==`` (markers
    of this machine applied, extras left out); None when its metadata is not found."""
    requires = _requires(path, distribution)
    if requires is None:
        return None
    from packaging.requirements import InvalidRequirement, Requirement

    pins: dict[str, str] = {}
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[_canonical(req.name)] = exact[0]
    return pins


def pin_mismatch(cb: Any, found: Any) -> str | None:
    """The first of the profile's ``import_pins`` that the code base pins in another version than
    the one importable here (or that is missing), in words with the fix; None when all hold."""
    names = getattr(cb, "import_pins", ()) or ()
    if not names or found is None:
        return None
    pins = exact_pins(found.path, cb.distribution)
    if not pins:
        return None
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    for name in names:
        pin = pins.get(_canonical(name))
        if pin is None:
            continue
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            here = None
        if here is not None and here in SpecifierSet(f"=={pin}", prereleases=True):
            continue
        have = f"{here} is installed" if here else "none is installed"
        return (
            f"{cb.package} {found.version} pins {name}=={pin}; {have}: pip install '{name}=={pin}' (or run that "
            f"release with --release {found.version}, which brings its own)"
        )
    return None


def check_pins(cb: Any, found: Any, *, what: str) -> None:
    """One line naming the first of the profile's ``import_pins`` the code base pins in another
    version than the one importable here (``pin_mismatch``)."""
    said = pin_mismatch(cb, found)
    if said is not None:
        raise ConfigError(f"{what}: {said}")


def _canonical(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(path: str, distribution: str) -> list[str] | None:
    """The Requires-Dist of the code base at ``path``: its own ``.dist-info`` beside it (an
    installed wheel, a release's unpacked one), an editable install's metadata, or the
    ``[project] dependencies`` of a source tree's pyproject.toml."""
    site = os.path.dirname(path)
    prefix = distribution.replace("-", "_").lower() + "-"
    try:
        infos = [n for n in os.listdir(site) if n.endswith(".dist-info") and n.lower().startswith(prefix)]
    except OSError:
        infos = []
    if len(infos) == 1:
        meta = os.path.join(site, infos[0], "METADATA")
        try:
            with open(meta, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return None
        head = text.split("\n\n", 1)[0]  # the headers; the long description follows the blank line
        return [line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("Requires-Dist:")]
    for folder in (site, os.path.dirname(site)):
        pyproject = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(pyproject):
            import tomllib

            try:
                with open(pyproject, "rb") as fh:
                    deps = (tomllib.load(fh).get("project") or {}).get("dependencies")
            except (OSError, tomllib.TOMLDecodeError):
                return None
            return [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else None
    return None
