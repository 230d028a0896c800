"""Survivors a person read and found equivalent: the profile's list of mutant ids, each with the
function it mutates and why no input can tell it from the code as written.

A survivor is work only while it may be a missing scenario. Once a reviewer has argued that none
can exist (the mutant sizes a buffer nothing reads, or changes a value the next line overwrites),
``sglfix mutate`` reports it as equivalent (reviewed) instead of survived, with the reason, so the
survivors left are the ones worth a scenario. A mark is a claim the campaign keeps checking: a
marked mutant that a cell kills contradicts it (the kill stands, and the mark must go); a mark
whose function the campaign mutated without making that mutant is stale (the code moved under
it: read it again). Ids are stable while the function's text is (``sglfix.mutation.model``).

The file (``equivalent_mutants`` in ``profile.toml``, relative to the profile folder, outside its
toggle files: ``mutants/equivalent.yaml``)::

    - id: m-fb03892800
      function: sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata_out_graph
      why: capture plans the dummy fill batch whatever the scenario; every replay plans again
      atop: [fimla-draft-plan]   # optional: holds only in a campaign atop these candidate fixes
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from sglfix.common.errors import ConfigError
from sglfix.mutation.model import MUTANT_PREFIX

__all__ = ["Mark", "load_marks", "marks_file", "marks_for"]

_ID = re.compile(re.escape(MUTANT_PREFIX) + r"[0-9a-f]{10}")


class Mark(BaseModel):
    """One reviewed equivalent."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str
    function: Annotated[str, Field(min_length=1)]
    why: Annotated[str, Field(min_length=10)]
    # The candidate fixes (their ids) the argument needs: the mark holds only in a campaign atop them.
    atop: list[str] = []

    @field_validator("id")
    @classmethod
    def _an_id(cls, value: str) -> str:
        if not _ID.fullmatch(value):
            raise ValueError(f"{value!r} is not a mutant id ({MUTANT_PREFIX} and ten hex digits, as mutate reports)")
        return value


_MARKS = TypeAdapter(list[Mark])


def marks_file(codebase: Any) -> str | None:
    """The profile's marks file (absolute), or None where its ``profile.toml`` names none."""
    name = getattr(codebase, "equivalent_mutants", "")
    if not name:
        return None
    return os.path.join(codebase.folder, name)


def load_marks(path: str, *, shown: str | None = None) -> dict[str, Mark]:
    """The marks of ``path`` by id; ConfigError (one line naming the file, the entry and the fix)
    for a file that is missing or not a list of marks, or an id marked twice."""
    import yaml

    shown = shown or path
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file (profile.toml's equivalent_mutants names it)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{shown}:{where} not YAML: {getattr(exc, 'problem', exc)}") from None
    try:
        marks = _MARKS.validate_python(data if data is not None else [])
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(k) for k in err["loc"]) or "the file"
        raise ConfigError(f"{shown}: entry {where}: {err['msg']}; each entry is id, function, why (atop)") from None
    out: dict[str, Mark] = {}
    for mark in marks:
        if mark.id in out:
            raise ConfigError(f"{shown}: {mark.id} is marked twice; keep one entry")
        out[mark.id] = mark
    return out


def marks_for(marks: Mapping[str, Mark], *, applied: Sequence[str]) -> dict[str, Mark]:
    """The marks that hold in a campaign atop the candidate fixes ``applied`` (their ids)."""
    have = set(applied)
    return {mid: m for mid, m in marks.items() if set(m.atop) <= have}
