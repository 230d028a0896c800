"""The toggle registry: ``toggles/<pr>.yaml`` files, loaded lazily and validated strictly.

A toggle file is sglang's patch schema plus metadata (``ToggleFile``, a pydantic model). Its
patches are either one top-level ``patches:`` list (one part, named ``main``) or named
``parts:``. The file model is what a file may say; ``Toggle``, ``Part`` and ``Expectation`` are
what the rest of sglfix reads. Ids (``27460``, ``27460:sizing``) are ``ToggleId``s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from sglfix.codebases.records import engine_version
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.common.schema import NodeError, StrictModel, describe_kind, nearest, validate_node
from sglfix.common.verdicts import VERDICTS, Verdict
from sglfix.common.yamlio import line_of, load_yaml, read_text_file
from sglfix.patching.types import PatchList, PatchSpec, Text
from sglfix.toggling.ids import EXAMPLE, MAX_PR, PART_NAME_RE, ToggleId, is_candidate_id
from sglfix.toggling.variants import VariantFile, choose_variant, read_variants

__all__ = [
    "MAIN_PART",
    "Expectation",
    "Part",
    "Registry",
    "Selection",
    "Toggle",
    "ToggleFile",
    "ToggleId",
    "default_toggles_dir",
    "load_registry",
    "parse_toggle",
    "parse_toggle_ids",
]

MAIN_PART = "main"
DEVICES = ("any", "cpu", "cuda")


# --------------------------------------------------------------------------- the file


def _non_empty_text(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise NodeError(
            f"must be non-empty text; got {'empty text' if isinstance(value, str) else describe_kind(value)}"
        )
    return value.strip()


def _stripped_text(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


NonEmptyText = Annotated[str, BeforeValidator(_non_empty_text)]
MetaText = Annotated[Text, BeforeValidator(_stripped_text)]


def _pr_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PR:
        raise NodeError(f"must be a positive PR number, got {value!r}")
    return value


PrNumber = Annotated[int, BeforeValidator(_pr_number)]


def _verdicts(value: Any) -> Any:
    items = list(value) if isinstance(value, list) else [value]
    if not items:
        raise NodeError(f"names no verdict; use one or a list of {', '.join(VERDICTS)}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or item not in VERDICTS:
            raise NodeError(
                f"{item!r} is not a verdict{nearest(str(item), VERDICTS)}; use one of {', '.join(VERDICTS)}",
                at=i if isinstance(value, list) else (),
            )
    return tuple(Verdict(v) for v in items)


def _revert_ids(value: Any) -> Any:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    ids: list[str] = []
    for item in items:
        for token in str(item).split(",") if isinstance(item, (str, int)) and not isinstance(item, bool) else [item]:
            if isinstance(token, str) and not token.strip():
                raise NodeError(f"has an empty toggle id (stray comma?); give ids like {EXAMPLE}")
            try:
                ids.append(str(ToggleId.parse(token)))
            except ConfigError:
                raise NodeError(f"{token!r} is not a toggle id like {EXAMPLE}") from None
    return tuple(ids)


def _device(value: Any) -> Any:
    if value not in DEVICES:
        raise NodeError(f"{value!r} is not a device{nearest(str(value), DEVICES)}; use any, cpu or cuda")
    return value


_VERDICT = {"enum": list(VERDICTS)}


class ExpectFile(StrictModel):
    """Reverting ``revert`` (default: the whole toggle) gives one of ``verdict`` on ``scenario``."""

    scenario: NonEmptyText
    # The JSON Schema describes what a file may hold (one verdict or a list; an id, a comma list
    # or a list of ids), not the tuple it validates to.
    verdict: Annotated[
        tuple[Verdict, ...],
        BeforeValidator(_verdicts),
        WithJsonSchema({"anyOf": [_VERDICT, {"type": "array", "items": _VERDICT, "minItems": 1}]}),
    ]
    revert: Annotated[
        tuple[str, ...] | None,
        BeforeValidator(_revert_ids),
        WithJsonSchema(
            {"anyOf": [{"type": ["string", "integer"]}, {"type": "array", "items": {"type": ["string", "integer"]}}]}
        ),
    ] = None
    device: Annotated[str, BeforeValidator(_device)] = "any"


class PartFile(StrictModel):
    summary: NonEmptyText
    patches: PatchList
    # A refactor that came with the fix (e.g. a helper replacing an inline expression): reverting
    # it alone must change no verdict, which its expectations state and the matrix confirms.
    behaviour_neutral: StrictBool = False
    # Why no scenario can detect this part (a refactor with no behaviour of its own): the
    # doctor's static check covers it; the detection table does not ask for a scenario.
    static_only: NonEmptyText | None = None
    # The part in other releases of the engine than the profile's own (sglfix.toggling.variants).
    variants: tuple[VariantFile, ...] = ()


def _part_names(value: Any) -> Any:
    if not isinstance(value, Mapping) or not value:
        raise NodeError(f"must be a mapping of part name -> {{summary, patches}}; got {describe_kind(value)}")
    for name in value:
        if not isinstance(name, str) or not PART_NAME_RE.fullmatch(name):
            raise NodeError(f"has a bad part name {name!r}: use lowercase letters, digits, '-' or '_'", at=name)
    return value


class ToggleFile(StrictModel):
    """``toggles/<pr>.yaml``. The validation context's ``path`` is the file's path."""

    pr: PrNumber
    title: NonEmptyText
    url: MetaText = ""
    bug: MetaText = ""
    description: MetaText = ""
    patches: PatchList = ()
    # Per-version variants of a one-part toggle's ``patches`` (a named part carries its own).
    variants: tuple[VariantFile, ...] = ()
    parts: Annotated[dict[str, PartFile], BeforeValidator(_part_names)] = Field(default_factory=dict)
    expect: tuple[ExpectFile, ...] = ()
    caught_by: tuple[StrictStr, ...] = ()
    peers: tuple[PrNumber, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _patches_or_parts(cls, data: Any) -> Any:
        # An unknown key (a misspelt `patches`) is reported as such, not as a missing one.
        if (
            isinstance(data, Mapping)
            and not set(data) - set(cls.model_fields)
            and ("patches" in data) == ("parts" in data)
        ):
            raise NodeError("a toggle file needs exactly one of 'patches' (one part) or 'parts' (named parts)")
        return data

    @field_validator("pr")
    @classmethod
    def _pr_matches_file_name(cls, pr: int, info: ValidationInfo) -> int:
        path = (info.context or {}).get("path")
        if path:
            stem = Path(path).stem
            if stem.isascii() and stem.isdigit() and int(stem) != pr:
                raise NodeError(f"{pr} does not match the file name {Path(path).name}; rename one")
        return pr

    @model_validator(mode="after")
    def _expect_names_own_parts(self) -> ToggleFile:
        names = list(self.parts) if self.parts else [MAIN_PART]
        for i, item in enumerate(self.expect):
            for text in item.revert or ():
                rid = ToggleId.parse(text)
                if rid.pr == self.pr and rid.part is not None and rid.part not in names:
                    raise NodeError(
                        f"expect[{i}].revert names part {rid.part!r}, not a part of {self.pr}"
                        f"{nearest(rid.part, names)}; parts: {', '.join(names)}",
                        at=("expect", i, "revert"),
                    )
        return self


# --------------------------------------------------------------------------- what sglfix reads


@dataclass(frozen=True, kw_only=True)
class Part:
    name: str
    summary: str
    patches: tuple[PatchSpec, ...]
    behaviour_neutral: bool = False
    static_only: str | None = None
    # At the version the registry was loaded for: the variant's range used (None: the part's own
    # patches) and, when no revert of the fix exists there, why (its ``patches`` are then empty).
    variant: str | None = None
    absent: str | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.target for p in self.patches))


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """Reverting ``revert`` must give one of ``verdicts`` on the scenarios ``scenario`` names."""

    scenario: str
    verdicts: tuple[Verdict, ...]
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
        return str(ToggleId(self.pr))

    @property
    def ids(self) -> list[str]:
        return [self.id] + [str(ToggleId(self.pr, name)) for name in self.parts]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for part in self.parts.values() for t in part.targets))


@dataclass(frozen=True)
class Selection:
    """One part of one toggle, as selected by an id."""

    toggle: Toggle
    part: Part

    @property
    def toggle_id(self) -> ToggleId:
        return ToggleId(self.toggle.pr, self.part.name)

    @property
    def id(self) -> str:
        return str(self.toggle_id)


def parse_toggle(text: str, *, path: str, version: str | None = None) -> Toggle:
    """The toggle in ``text``, each part as it is at ``version`` of the engine (its variant
    there, if any; None: the parts' own patches)."""
    raw = load_yaml(text, source=path)
    file = validate_node(ToggleFile, raw, where=path, context={"path": path}, root="toggle file")

    names = list(file.parts) if file.parts else [MAIN_PART]
    written = read_variants(path, pr=file.pr, parts=names)

    def part(name: str, summary: str, patches: tuple, variants: tuple, **kw: Any) -> Part:
        chosen = choose_variant(patches, (*variants, *written.get(name, ())), version=version)
        return Part(
            name=name, summary=summary, patches=chosen.patches, variant=chosen.versions, absent=chosen.absent, **kw
        )

    if "patches" in file.model_fields_set:
        parts = {MAIN_PART: part(MAIN_PART, file.title, file.patches, file.variants)}
    else:
        parts = {
            name: part(
                name, p.summary, p.patches, p.variants, behaviour_neutral=p.behaviour_neutral, static_only=p.static_only
            )
            for name, p in file.parts.items()
        }
    expect_node = raw.get("expect") or []
    expect = tuple(
        Expectation(
            scenario=e.scenario,
            verdicts=e.verdict,
            revert=e.revert or (str(ToggleId(file.pr)),),
            device=e.device,
            line=line_of(expect_node, i),
        )
        for i, e in enumerate(file.expect)
    )
    return Toggle(
        pr=file.pr,
        title=file.title,
        url=file.url,
        bug=file.bug,
        description=file.description,
        parts=parts,
        expect=expect,
        caught_by=file.caught_by,
        peers=file.peers,
        path=path,
    )


# --------------------------------------------------------------------------- the registry


class Registry:
    def __init__(self, toggles: Iterable[Toggle], *, directory: str, version: str | None = None) -> None:
        self.directory = directory
        self.version = version  # the engine version the parts were chosen for (None: their own)
        # Candidate fixes (--apply) a command applies in its sets: selected by their ``+name`` ids.
        self.candidates: dict[str, Any] = {}
        self.toggles: dict[int, Toggle] = {}
        for t in toggles:
            if t.pr in self.toggles:
                raise ConfigError(f"{t.path}: PR {t.pr} is already registered by {self.toggles[t.pr].path}")
            self.toggles[t.pr] = t
        for t in self:
            for i, e in enumerate(t.expect):
                for rid in e.revert:
                    try:
                        self.select(rid, what="revert")
                    except ConfigError as exc:
                        raise ConfigError(f"{t.path}:{e.line}: expect[{i}].{exc}") from None

    def __len__(self) -> int:
        return len(self.toggles)

    def __iter__(self):
        return iter(sorted(self.toggles.values(), key=lambda t: t.pr))

    def ids(self, *, parts: bool = True) -> list[str]:
        return [i for t in self for i in (t.ids if parts else [t.id])]

    def absent(self, ids: Iterable[str]) -> dict[str, str]:
        """The parts ``ids`` select that have no revert at this version, and why (in words)."""
        where = f" at version {self.version}" if self.version else ""
        return {
            s.id: f"{s.id} does not apply{where}: {s.part.absent}"
            for rid in ids
            for s in self.select(rid)
            if s.part.absent
        }

    def with_candidates(self, candidates: Iterable[Any]) -> Registry:
        """This registry, also selecting ``candidates`` (``sglfix.toggling.candidate``) by id."""
        import copy

        out = copy.copy(self)
        out.candidates = {**self.candidates, **{c.id: c for c in candidates}}
        return out

    def describe_ids(self) -> str:
        if not self.toggles:
            return f"none (no toggle files in {self.directory})"
        return ", ".join(
            t.id + (f" (parts: {', '.join(t.parts)})" if list(t.parts) != [MAIN_PART] else "") for t in self
        )

    def select(self, token: str | ToggleId, *, what: str = "toggle id") -> list[Selection]:
        """The parts an id names; errors start with ``what`` and show the nearest id."""
        if is_candidate_id(token):
            cand = self.candidates.get(token.strip())
            if cand is None:
                given = ", ".join(self.candidates) or "none"
                raise ConfigError(
                    f"{what}: {token.strip()} is not a candidate fix of this run{nearest(token, self.candidates)}; "
                    f"--apply gave: {given}"
                )
            return [cand.selection]
        rid = ToggleId.parse(token, what=what)
        toggle = self.toggles.get(rid.pr)
        if toggle is None:
            raise ConfigError(
                f"{what}: PR {rid.pr} is not registered{nearest(str(rid.pr), map(str, self.toggles))}; "
                f"registered: {self.describe_ids()}"
            )
        if rid.part is None:  # the whole toggle
            return [Selection(toggle, p) for p in toggle.parts.values()]
        part = toggle.parts.get(rid.part)
        if part is None:
            raise ConfigError(
                f"{what}: {rid.pr} has no part {rid.part!r}{nearest(rid.part, toggle.parts)}; "
                f"parts: {', '.join(toggle.parts)}"
            )
        return [Selection(toggle, part)]


def parse_toggle_ids(tokens: Iterable[str | ToggleId], *, registry: Registry, what: str) -> list[Selection]:
    """Expand ids into parts. An empty id and overlaps (``27460`` and ``27460:sizing``) are errors."""
    out: list[Selection] = []
    seen: dict[str, str] = {}
    for token in tokens:
        for sel in registry.select(token, what=what):
            if sel.id in seen:
                raise ConfigError(
                    f"{what}: {str(token)!r} selects {sel.id} again (already selected by "
                    f"{seen[sel.id]!r}); list it once"
                )
            seen[sel.id] = str(token)
            out.append(sel)
    return out


def default_toggles_dir() -> str:
    """``SGLFIX_TOGGLES_DIR``, else the directory of the profile ``SGLFIX_PROFILE`` names."""
    env = envs.SGLFIX_TOGGLES_DIR.get()
    if env:
        return env
    from sglfix.toggling.profiles import resolve_profile

    profile = resolve_profile().profile
    assert profile is not None  # only the start-up hook's form leaves it to the first import
    return profile.toggles_dir


def _toggle_files(directory: str) -> list[Path]:
    """The directory's ``*.yaml`` entries, or a one-line error that says what is wrong with it."""
    what = f"toggles directory {directory}"
    path = Path(directory)
    try:
        if not path.exists():
            raise ConfigError(f"{what} does not exist; pass an existing --toggles DIR")
        if not path.is_dir():
            raise ConfigError(f"{what} is a file, not a directory; pass the directory that holds the toggle files")
        # iterdir raises on an unreadable directory, where glob would silently find nothing.
        return sorted(p for p in path.iterdir() if p.name.endswith(".yaml"))
    except PermissionError:
        raise ConfigError(f"{what} is not readable (permission denied); fix its permissions") from None
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read: {exc.strerror or exc}") from None


@lru_cache(maxsize=8)
def _load(directory: str, version: str | None) -> Registry:
    toggles = [
        parse_toggle(read_text_file(f, what="toggle file"), path=str(f), version=version)
        for f in _toggle_files(directory)
    ]
    return Registry(toggles, directory=directory, version=version)


def load_registry(
    directory: str | os.PathLike | None = None, *, own: bool = False, version: str | None = None
) -> Registry:
    """The toggles of ``directory`` (default: the profile's), each part as it is in the engine
    version installed here when a profile of an engine keeps its toggles there; ``own``: the
    parts' own patches, whatever is installed (what ``toggle port`` re-anchors); ``version``: as
    they are in that version (a source tree ``doctor --source`` reads)."""
    path = str(Path(directory or default_toggles_dir()).resolve())
    return _load(path, None if own else version or engine_version(path))
