"""Porting a profile's toggles onto another version's source: each fix's lines located again.

A revert is an edit written against one version's function (``match`` the fixed lines,
``replacement`` the pre-fix ones). In another release the function may have moved around the
fix (a renamed argument, a line added near it): the match is then no longer found verbatim. The
port finds the block of the other version's function most like the match, and three-way merges
the edit onto it (base: the match; one side: the revert; the other: that release's lines), so
that the revert changes there exactly what it changes here. A line the release changed that the
revert's own new lines repeat (the same call written again) is changed in them the same way.
What does not merge, a function that does not exist there, or a block found twice is not ported,
and is listed with the function and its lines. A release whose function already holds the
pre-fix lines predates the fix: no revert exists there (``absent``).

Nothing here imports the engine: functions are read from the source files (``doctor --source``).
"""

from __future__ import annotations

import difflib
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from sglfix.common.errors import SglfixError
from sglfix.patching.editor import apply_single_edit, effective_replacement, find_match_positions
from sglfix.patching.types import EditSpec, PatchSpec
from sglfix.toggling.doctor import locate_source, static_apply
from sglfix.toggling.registry import Part, Registry

__all__ = ["PartPort", "port_part", "port_registry"]

_MIN_SIMILAR = 0.6  # below this, the closest block is not the fix's lines moved, but other code
_SLACK = 4  # a block may have this many lines more or fewer than the match


@dataclass
class PartPort:
    """One part at the other version: ``applies`` as it is, ``ported`` (``patches``), ``absent``
    (why no revert exists there) or not ported (``problem``: the function and its lines)."""

    id: str
    status: str  # applies | ported | absent | failed
    patches: tuple[PatchSpec, ...] = ()
    why: str = ""
    changed: list[str] = field(default_factory=list)  # "target edit #n" re-anchored
    # The range of the part's variant this result is (the profile already has it): nothing to write.
    variant: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status, "why": self.why, "changed": self.changed, "variant": self.variant}


def port_registry(registry: Registry, *, source_dir: Path) -> list[PartPort]:
    """Every part of ``registry`` against the release at ``source_dir``: a part that already has a
    variant there (the registry loaded at that release's version) is checked as it is, the others
    are ported from their own patches."""
    return [
        port_part(f"{t.pr}:{name}" if len(t.parts) > 1 else t.id, part, source_dir=source_dir)
        for t in registry
        for name, part in t.parts.items()
    ]


def port_part(pid: str, part: Part, *, source_dir: Path) -> PartPort:
    if part.variant is not None:
        if part.absent is not None:
            return PartPort(pid, "absent", why=part.absent, variant=part.variant)
        try:
            static_apply(list(part.patches), source_dir)
        except SglfixError as exc:
            return PartPort(
                pid, "failed", why=f"its variant for {part.variant} does not apply: {str(exc).splitlines()[0]}"
            )
        return PartPort(
            pid, "applies", patches=part.patches, why=f"(its variant for {part.variant})", variant=part.variant
        )
    try:
        static_apply(list(part.patches), source_dir)
        return PartPort(pid, "applies", patches=part.patches)
    except SglfixError:
        pass
    current: dict[str, tuple[str, str, int]] = {}
    out: list[PatchSpec] = []
    changed: list[str] = []
    for spec in part.patches:
        try:
            filename, source, first = current.get(spec.target) or locate_source(spec.target, source_dir)
        except SglfixError as exc:
            return PartPort(pid, "failed", why=f"{spec.target}: not in this release ({str(exc).splitlines()[0]})")
        edits: list[EditSpec] = []
        for number, edit in enumerate(spec.edits, start=1):
            where = f"{spec.target} edit #{number}"
            lines = source.splitlines()
            if len(find_match_positions(source_lines=lines, match_lines=edit.match.strip().splitlines())) == 1:
                new = edit
            else:
                if _holds(lines, effective_replacement(edit=edit)) and not _holds(lines, edit.match):
                    return PartPort(
                        pid,
                        "absent",
                        why=f"the release predates the fix: {spec.target} ({filename}:{first}) already has "
                        f"the pre-fix lines of edit #{number}",
                    )
                try:
                    new = _reanchor(edit, lines)
                except _NoPort as exc:
                    return PartPort(pid, "failed", why=f"{where} ({filename}:{first}, {len(lines)} lines): {exc}")
                changed.append(where)
            edits.append(new)
            source = apply_single_edit(source=source, edit=new, number=number)
        current[spec.target] = (filename, source, first)
        out.append(PatchSpec(target=spec.target, edits=tuple(edits), preamble=spec.preamble))
    patches = tuple(out)
    try:
        static_apply(list(patches), source_dir)
    except SglfixError as exc:
        return PartPort(pid, "failed", why=f"the ported edits do not apply: {str(exc).splitlines()[0]}")
    return PartPort(pid, "ported", patches=patches, changed=changed)


class _NoPort(Exception):
    pass


def _holds(lines: list[str], text: str) -> bool:
    wanted = text.strip().splitlines()
    return bool(wanted) and bool(find_match_positions(source_lines=lines, match_lines=wanted))


def _closest_block(lines: list[str], match: list[str]) -> tuple[int, int]:
    """(start, end) of the one block of ``lines`` most like ``match`` (any length near its own)."""
    want = [m.strip() for m in match]
    stripped = [line.strip() for line in lines]
    scored: list[tuple[float, int, int]] = []
    for size in range(max(1, len(want) - _SLACK), len(want) + _SLACK + 1):
        for start in range(max(0, len(stripped) - size) + 1):
            ratio = difflib.SequenceMatcher(None, stripped[start : start + size], want, autojunk=False).ratio()
            scored.append((ratio, start, start + size))
    if not scored:
        raise _NoPort("the function is empty")
    scored.sort(key=lambda s: (-s[0], s[2] - s[1]))
    best, start, end = scored[0]
    if best < _MIN_SIMILAR:
        raise _NoPort(f"no block like the fix's lines (the closest is {best:.0%} similar, at line {start + 1})")
    for ratio, s, e in scored[1:]:
        if ratio < best - 0.05:
            break
        if e <= start or s >= end:  # another place, as like the match: which one is meant is a guess
            raise _NoPort(f"the fix's lines are as like lines {start + 1}-{end} as lines {s + 1}-{e}")
    return start, end


def _reanchor(edit: EditSpec, lines: list[str]) -> EditSpec:
    import merge3

    base = textwrap.dedent(edit.match.strip("\n")).splitlines()
    start, end = _closest_block(lines, base)
    theirs = textwrap.dedent("\n".join(lines[start:end])).splitlines()
    # What the release did to the fix's lines, line by line: applied to the revert's own new lines
    # that repeat one of them (a call the revert writes again), as it was to the code.
    renamed: dict[str, str | None] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, [b.strip() for b in base], [t.strip() for t in theirs], autojunk=False
    ).get_opcodes():
        if tag == "delete":
            renamed.update({base[i].strip(): None for i in range(i1, i2)})
        elif tag == "replace" and i2 - i1 == j2 - j1:
            renamed.update({base[i].strip(): theirs[j1 + i - i1].strip() for i in range(i1, i2)})

    def carry(text_lines: list[str]) -> list[str]:
        out: list[str] = []
        for line in text_lines:
            key = line.strip()
            if key in renamed:
                if (new := renamed[key]) is not None:
                    out.append(line[: len(line) - len(line.lstrip())] + new)
                continue
            out.append(line)
        return out

    match_text = "\n".join(theirs) + "\n"
    if edit.mode != "replacement":
        text = textwrap.dedent(getattr(edit, edit.mode).strip("\n")).splitlines()
        return EditSpec(match=match_text, **{edit.mode: "\n".join(carry(text)) + "\n"})
    ours = textwrap.dedent(edit.replacement.strip("\n")).splitlines() if edit.replacement.strip() else []
    merged: list[str] = []
    for region in merge3.Merge3(base, ours, theirs, is_cherrypick=False).merge_regions():
        kind = region[0]
        if kind == "unchanged":
            merged += base[region[1] : region[2]]
        elif kind in ("same", "a"):
            merged += carry(ours[region[1] : region[2]])
        elif kind == "b":
            merged += theirs[region[1] : region[2]]
        else:
            raise _NoPort(
                f"the release changed the lines the fix changed (base {region[1] + 1}-{region[2]} of the match); "
                f"port it by hand"
            )
    return EditSpec(match=match_text, replacement="\n".join(merged) + "\n" if merged else "")
