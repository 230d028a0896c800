"""Typed patch specs in sglang's schema (``patches[].target/preamble/edits[]``), strictly validated."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from sglfix.common.errors import ConfigError
from sglfix.common.yamlio import line_of, load_yaml

__all__ = [
    "EditSpec",
    "PatchSpec",
    "PatchConfig",
    "parse_patch_list",
    "parse_patch_config",
    "check_keys",
    "nearest",
]

_EDIT_MODES = ("replacement", "prepend", "append")
_TARGET_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)


def nearest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' or '' — appended to messages about unknown names."""
    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def check_keys(
    node: Any,
    *,
    where: str,
    what: str,
    allowed: Iterable[str],
    required: Iterable[str] = (),
) -> None:
    """Unknown keys and missing keys are errors that name the file:line and the fix."""
    allowed = tuple(allowed)
    if not isinstance(node, Mapping):
        raise ConfigError(
            f"{where}:{line_of(node)}: {what} must be a mapping with keys "
            f"{', '.join(allowed)}; got {_kind(node)}"
        )
    for key in node:
        if key not in allowed:
            raise ConfigError(
                f"{where}:{line_of(node, key)}: unknown key {key!r} in {what}"
                f"{nearest(key, allowed)}; allowed: {', '.join(allowed)}"
            )
    for key in required:
        if key not in node:
            raise ConfigError(f"{where}:{line_of(node)}: {what} lacks required key {key!r}")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, list) and not value:
        return "an empty list"
    for types_, name in ((Mapping, "a mapping"), (list, "a list"), (bool, "true/false"),
                         ((int, float), "a number"), (str, "text")):
        if isinstance(value, types_):
            return name
    return type(value).__name__


def _text(node: Mapping, key: str, *, where: str, what: str, default: str | None = None) -> str:
    if key not in node:
        if default is None:
            raise ConfigError(f"{where}:{line_of(node)}: {what} lacks required key {key!r}")
        return default
    value = node[key]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(
            f"{where}:{line_of(node, key)}: {what}.{key} must be text (use a `|` block); "
            f"got {_kind(value)}"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class EditSpec:
    """One edit: replace the matched lines, or add lines before/after them.

    ``replacement`` empty means delete. Only one of replacement/prepend/append may be set.
    """

    match: str
    replacement: str = ""
    prepend: str = ""
    append: str = ""

    def __post_init__(self) -> None:
        for name in ("match", *_EDIT_MODES):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"EditSpec.{name} must be a string")
        if not self.match.strip():
            raise ConfigError("EditSpec.match is empty: give the lines to find")
        active = [name for name in _EDIT_MODES if getattr(self, name).strip()]
        if len(active) > 1:
            raise ConfigError(
                f"EditSpec sets {' and '.join(active)}: only one of replacement, prepend, append"
            )

    @property
    def mode(self) -> str:
        for name in ("prepend", "append"):
            if getattr(self, name).strip():
                return name
        return "replacement"


@dataclass(frozen=True, kw_only=True)
class PatchSpec:
    """Edits to one function, named by its dotted path (``pkg.mod.Class.method``)."""

    target: str
    edits: tuple[EditSpec, ...]
    preamble: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not _TARGET_RE.fullmatch(self.target):
            raise ConfigError(
                f"PatchSpec.target {self.target!r} is not a dotted path like pkg.module.Class.method"
            )
        edits = tuple(e if isinstance(e, EditSpec) else EditSpec(**dict(e)) for e in self.edits)
        if not edits:
            raise ConfigError(f"PatchSpec for {self.target} has no edits")
        object.__setattr__(self, "edits", edits)


@dataclass(frozen=True, kw_only=True)
class PatchConfig:
    patches: tuple[PatchSpec, ...] = field(default_factory=tuple)


def _parse_edit(node: Any, *, where: str, what: str) -> EditSpec:
    check_keys(node, where=where, what=what, allowed=("match", *_EDIT_MODES), required=("match",))
    match = _text(node, "match", where=where, what=what)
    if not match.strip():
        raise ConfigError(f"{where}:{line_of(node, 'match')}: {what}.match is empty: give the lines to find")
    given = [name for name in _EDIT_MODES if name in node]
    if len(given) > 1:
        raise ConfigError(
            f"{where}:{line_of(node, given[1])}: {what} has both {given[0]!r} and {given[1]!r}; "
            "keep exactly one of replacement, prepend, append"
        )
    values = {name: _text(node, name, where=where, what=what, default="") for name in _EDIT_MODES}
    return EditSpec(match=match, **values)


def parse_patch_list(node: Any, *, where: str, what: str = "patches") -> tuple[PatchSpec, ...]:
    if not isinstance(node, list) or not node:
        raise ConfigError(
            f"{where}:{line_of(node)}: {what} must be a non-empty list of "
            f"{{target, edits}} items; got {_kind(node)}"
        )
    specs: list[PatchSpec] = []
    for i, item in enumerate(node):
        item_what = f"{what}[{i}]"
        check_keys(item, where=where, what=item_what, allowed=("target", "preamble", "edits"),
                   required=("target", "edits"))
        target = item["target"]
        if not isinstance(target, str) or not _TARGET_RE.fullmatch(target):
            raise ConfigError(
                f"{where}:{line_of(item, 'target')}: {item_what}.target {target!r} is not a "
                "dotted path like pkg.module.Class.method"
            )
        edits_node = item["edits"]
        if not isinstance(edits_node, list) or not edits_node:
            raise ConfigError(
                f"{where}:{line_of(item, 'edits')}: {item_what}.edits must be a non-empty list of "
                f"{{match, replacement|prepend|append}}; got {_kind(edits_node)}"
            )
        edits = tuple(
            _parse_edit(e, where=where, what=f"{item_what}.edits[{j}]") for j, e in enumerate(edits_node)
        )
        preamble = _text(item, "preamble", where=where, what=item_what, default="")
        specs.append(PatchSpec(target=target, edits=edits, preamble=preamble))
    return tuple(specs)


def parse_patch_config(text: str, *, source: str = "<yaml>") -> PatchConfig:
    """sglang's top-level schema: a mapping with exactly the key ``patches``."""
    raw = load_yaml(text, source=source)
    check_keys(raw, where=source, what="patch config", allowed=("patches",), required=("patches",))
    return PatchConfig(patches=parse_patch_list(raw["patches"], where=source))
