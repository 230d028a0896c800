"""The toggle registry: ``toggles/<pr>.yaml`` files, loaded lazily and validated strictly.

A toggle file is sglang's patch schema plus metadata. Its patches are either one top-level
``patches:`` list (one part, named ``main``) or named ``parts:``. Ids: ``27460`` means every
part, ``27460:sizing`` one part.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from sglfix.common.errors import ConfigError
from sglfix.patching.types import PatchSpec, check_keys, nearest, parse_patch_list
from sglfix.common.verdicts import VERDICTS
from sglfix.common.yamlio import line_of, load_yaml

__all__ = [
    "Part", "Expectation", "Toggle", "Registry", "Selection",
    "default_toggles_dir", "load_registry", "parse_toggle_ids",
]

TOGGLES_ENV = "SGLFIX_TOGGLES_DIR"
_PART_RE = re.compile(r"[a-z][a-z0-9_-]*", re.ASCII)
_ID_RE = re.compile(r"([1-9][0-9]{0,8})(?::([a-z][a-z0-9_-]*))?", re.ASCII)
_TOP_KEYS = ("pr", "title", "url", "bug", "description", "parts", "patches", "expect", "caught_by", "peers")
MAIN_PART = "main"


@dataclass(frozen=True, kw_only=True)
class Part:
    name: str
    summary: str
    patches: tuple[PatchSpec, ...]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.target for p in self.patches))


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """Reverting ``revert`` must give one of ``verdicts`` on the scenarios ``scenario`` names."""

    scenario: str
    verdicts: tuple[str, ...]
    revert: tuple[str, ...]
    device: str = "any"
    line: int = 0


@dataclass(frozen=True, kw_only=True)
class Toggle:
    pr: int
    title: str
    url: str
    bug: str
    description: str
    parts: dict[str, Part]
    expect: tuple[Expectation, ...]
    caught_by: tuple[str, ...]
    peers: tuple[int, ...]
    path: str

    @property
    def id(self) -> str:
        return str(self.pr)

    @property
    def ids(self) -> list[str]:
        return [self.id] + [f"{self.pr}:{name}" for name in self.parts]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for part in self.parts.values() for t in part.targets))


@dataclass(frozen=True)
class Selection:
    """One part of one toggle, as selected by an id."""

    toggle: Toggle
    part: Part

    @property
    def id(self) -> str:
        return f"{self.toggle.pr}:{self.part.name}"


def _str(node, key, *, where, what, required=False, default="") -> str:
    if key not in node:
        if required:
            raise ConfigError(f"{where}:{line_of(node)}: {what} lacks required key {key!r}")
        return default
    value = node[key]
    if not isinstance(value, str) or (required and not value.strip()):
        raise ConfigError(f"{where}:{line_of(node, key)}: {what}.{key} must be non-empty text")
    return value.strip()


def _parse_expect(node, *, where: str, pr: int, parts: dict[str, Part]) -> tuple[Expectation, ...]:
    if node is None:
        return ()
    if not isinstance(node, list):
        raise ConfigError(f"{where}:{line_of(node)}: expect must be a list of {{scenario, verdict}} items")
    out: list[Expectation] = []
    for i, item in enumerate(node):
        what = f"expect[{i}]"
        check_keys(item, where=where, what=what, allowed=("scenario", "verdict", "revert", "device"),
                   required=("scenario", "verdict"))
        scenario = _str(item, "scenario", where=where, what=what, required=True)
        raw = item["verdict"]
        verdicts = tuple(raw) if isinstance(raw, list) else (raw,)
        for v in verdicts:
            if v not in VERDICTS:
                raise ConfigError(
                    f"{where}:{line_of(item, 'verdict')}: {what}.verdict {v!r} is not a verdict"
                    f"{nearest(str(v), VERDICTS)}; use one of {', '.join(VERDICTS)}"
                )
        revert_raw = item.get("revert", str(pr))
        revert = tuple(revert_raw) if isinstance(revert_raw, list) else tuple(
            t.strip() for t in str(revert_raw).split(","))
        for rid in revert:
            m = _ID_RE.fullmatch(str(rid))
            if not m:
                raise ConfigError(f"{where}:{line_of(item, 'revert')}: {what}.revert {rid!r} is not a toggle id like 26651 or 26651:clamp")
            if int(m.group(1)) == pr and m.group(2) and m.group(2) not in parts:
                raise ConfigError(
                    f"{where}:{line_of(item, 'revert')}: {what}.revert names part {m.group(2)!r}, "
                    f"not a part of {pr}{nearest(m.group(2), parts)}; parts: {', '.join(parts)}"
                )
        device = item.get("device", "any")
        if device not in ("any", "cpu", "cuda"):
            raise ConfigError(f"{where}:{line_of(item, 'device')}: {what}.device must be any, cpu or cuda")
        out.append(Expectation(scenario=scenario, verdicts=verdicts, revert=tuple(str(r) for r in revert),
                               device=device, line=line_of(node, i)))
    return tuple(out)


def parse_toggle(text: str, *, path: str) -> Toggle:
    where = path
    raw = load_yaml(text, source=where)
    check_keys(raw, where=where, what="toggle file", allowed=_TOP_KEYS, required=("pr", "title"))
    pr = raw["pr"]
    if isinstance(pr, bool) or not isinstance(pr, int) or pr <= 0:
        raise ConfigError(f"{where}:{line_of(raw, 'pr')}: pr must be a positive PR number, got {pr!r}")
    stem = Path(path).stem
    if stem.isascii() and stem.isdigit() and int(stem) != pr:
        raise ConfigError(f"{where}:{line_of(raw, 'pr')}: pr {pr} does not match the file name {Path(path).name}; rename one")
    if ("parts" in raw) == ("patches" in raw):
        raise ConfigError(f"{where}:{line_of(raw)}: a toggle file needs exactly one of 'patches' (one part) or 'parts' (named parts)")
    parts: dict[str, Part] = {}
    if "patches" in raw:
        parts[MAIN_PART] = Part(name=MAIN_PART, summary=_str(raw, "title", where=where, what="toggle"),
                                patches=parse_patch_list(raw["patches"], where=where))
    else:
        node = raw["parts"]
        if not isinstance(node, dict) or not node:
            raise ConfigError(f"{where}:{line_of(raw, 'parts')}: parts must be a mapping of part name -> {{summary, patches}}")
        for name, part in node.items():
            if not isinstance(name, str) or not _PART_RE.fullmatch(name):
                raise ConfigError(f"{where}:{line_of(node, name)}: part name {name!r} must be lowercase letters, digits, '-' or '_'")
            what = f"parts.{name}"
            check_keys(part, where=where, what=what, allowed=("summary", "patches"), required=("summary", "patches"))
            parts[name] = Part(name=name, summary=_str(part, "summary", where=where, what=what, required=True),
                               patches=parse_patch_list(part["patches"], where=where, what=f"{what}.patches"))
    caught = raw.get("caught_by", [])
    peers = raw.get("peers", [])
    if not isinstance(caught, list) or not all(isinstance(c, str) for c in caught):
        raise ConfigError(f"{where}:{line_of(raw, 'caught_by')}: caught_by must be a list of test ids")
    if not isinstance(peers, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in peers):
        raise ConfigError(f"{where}:{line_of(raw, 'peers')}: peers must be a list of PR numbers")
    return Toggle(
        pr=pr,
        title=_str(raw, "title", where=where, what="toggle", required=True),
        url=_str(raw, "url", where=where, what="toggle"),
        bug=_str(raw, "bug", where=where, what="toggle"),
        description=_str(raw, "description", where=where, what="toggle"),
        parts=parts,
        expect=_parse_expect(raw.get("expect"), where=where, pr=pr, parts=parts),
        caught_by=tuple(caught),
        peers=tuple(peers),
        path=path,
    )


class Registry:
    def __init__(self, toggles: Iterable[Toggle], *, directory: str) -> None:
        self.directory = directory
        self.toggles: dict[int, Toggle] = {}
        for t in toggles:
            if t.pr in self.toggles:
                raise ConfigError(f"{t.path}: PR {t.pr} is already registered by {self.toggles[t.pr].path}")
            self.toggles[t.pr] = t

    def __len__(self) -> int:
        return len(self.toggles)

    def __iter__(self):
        return iter(sorted(self.toggles.values(), key=lambda t: t.pr))

    def ids(self, *, parts: bool = True) -> list[str]:
        return [i for t in self for i in (t.ids if parts else [t.id])]

    def describe_ids(self) -> str:
        if not self.toggles:
            return f"none (no toggle files in {self.directory})"
        return ", ".join(
            t.id + (f" (parts: {', '.join(t.parts)})" if list(t.parts) != [MAIN_PART] else "") for t in self
        )

    def select(self, token: str) -> list[Selection]:
        m = _ID_RE.fullmatch(token)
        if not m:
            raise ConfigError(f"{token!r} is not a toggle id like 27460 or 27460:part; registered: {self.describe_ids()}")
        pr = int(m.group(1))
        toggle = self.toggles.get(pr)
        if toggle is None:
            raise ConfigError(f"PR {pr} is not registered{nearest(str(pr), map(str, self.toggles))}; registered: {self.describe_ids()}")
        if m.group(2) is None:
            return [Selection(toggle, p) for p in toggle.parts.values()]
        part = toggle.parts.get(m.group(2))
        if part is None:
            raise ConfigError(
                f"{pr} has no part {m.group(2)!r}{nearest(m.group(2), toggle.parts)}; parts: {', '.join(toggle.parts)}"
            )
        return [Selection(toggle, part)]


def parse_toggle_ids(tokens: Iterable[str], *, registry: Registry, what: str) -> list[Selection]:
    """Expand ids into parts; overlaps (``27460`` and ``27460:sizing``) are errors."""
    out: list[Selection] = []
    seen: dict[str, str] = {}
    for token in tokens:
        for sel in registry.select(token):
            if sel.id in seen:
                raise ConfigError(f"{what}: {token!r} selects {sel.id} again (already selected by {seen[sel.id]!r}); list it once")
            seen[sel.id] = token
            out.append(sel)
    return out


def default_toggles_dir() -> str:
    env = os.environ.get(TOGGLES_ENV)
    if env:
        return env
    from importlib.resources import files

    return str(files("sglfix.toggles"))


@lru_cache(maxsize=8)
def _load(directory: str) -> Registry:
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"toggles directory {directory} does not exist; pass an existing --toggles DIR")
    toggles = [parse_toggle(f.read_text(encoding="utf-8"), path=str(f)) for f in sorted(path.glob("*.yaml"))]
    return Registry(toggles, directory=directory)


def load_registry(directory: str | os.PathLike | None = None) -> Registry:
    return _load(str(Path(directory or default_toggles_dir()).resolve()))
