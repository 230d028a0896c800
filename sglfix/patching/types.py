"""Patch specs in sglang's schema (``patches[].target/preamble/edits[]``) as pydantic models.

The same models validate a YAML file (through ``validate_node``: one line with file:line and
the nearest allowed key) and specs built in Python (``EditSpec(match=...)``: a ``ConfigError``).
sglang's files validate unchanged; sglfix is stricter only where sglang would fail later or
silently: an empty ``match``, an empty ``edits`` list, a target that is not a dotted path.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, field_validator, model_validator

from sglfix.common.schema import ConfigModel, NodeError, describe_kind, validate_node
from sglfix.common.yamlio import load_yaml

__all__ = [
    "EDIT_MODES",
    "EditSpec",
    "PatchConfig",
    "PatchList",
    "PatchSpec",
    "Text",
    "parse_patch_config",
]

EDIT_MODES = ("replacement", "prepend", "append")
_TARGET_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)


def _as_text(value: Any) -> Any:
    # YAML's `key:` with nothing after it is null; sglang reads it as an empty string.
    if value is None:
        return ""
    if not isinstance(value, str):
        raise NodeError(f"must be text (use a `|` block); got {describe_kind(value)}")
    return value


Text = Annotated[str, BeforeValidator(_as_text)]


def _non_empty_list(*, items: str):
    def check(value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not value:
            raise NodeError(f"must be a non-empty list of {items} items; got {describe_kind(value)}")
        return value

    return BeforeValidator(check)


class EditSpec(ConfigModel):
    """One edit: replace the matched lines, or add lines before (prepend) or after (append).

    ``replacement`` empty means delete. At most one mode carries text, as in sglang.
    """

    match: Text
    replacement: Text = ""
    prepend: Text = ""
    append: Text = ""

    @field_validator("match")
    @classmethod
    def _match_has_lines(cls, value: str) -> str:
        if not value.strip():
            raise NodeError("is empty: give the lines to find")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_mode(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            given = [m for m in EDIT_MODES if isinstance(data.get(m), str) and data[m].strip()]
            if len(given) > 1:
                raise NodeError(
                    f"has both {given[0]!r} and {given[1]!r}: only one of replacement, prepend, append may be set",
                    at=given[1],
                )
        return data

    @property
    def mode(self) -> str:
        for name in ("prepend", "append"):
            if getattr(self, name).strip():
                return name
        return "replacement"


def _dotted_target(value: Any) -> Any:
    if not isinstance(value, str) or not _TARGET_RE.fullmatch(value):
        raise NodeError(f"{value!r} is not a dotted path like pkg.module.Class.method")
    return value


class PatchSpec(ConfigModel):
    """Edits to one function, named by its dotted path (``pkg.mod.Class.method``)."""

    target: Annotated[str, BeforeValidator(_dotted_target)]
    edits: Annotated[tuple[EditSpec, ...], _non_empty_list(items="{match, replacement|prepend|append}")]
    preamble: Text = ""


PatchList = Annotated[tuple[PatchSpec, ...], _non_empty_list(items="{target, edits}")]


class PatchConfig(ConfigModel):
    """sglang's top level: a mapping with exactly the key ``patches``."""

    patches: PatchList


def parse_patch_config(text: str, *, source: str = "<yaml>") -> PatchConfig:
    return _parse_patch_config(text, source)


@functools.lru_cache(maxsize=256)
def _parse_patch_config(text: str, source: str) -> PatchConfig:
    # The same YAML text always validates to the same (immutable) config.
    return validate_node(PatchConfig, load_yaml(text, source=source), where=source, root="patch config")
