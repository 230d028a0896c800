"""Text edits on a function's source: sglang's matching rule, with better diagnostics.

The rule (kept identical so that a YAML behaves the same under both tools): the ``match``
block is stripped as a whole, then compared line by line after ``strip()`` against the
source lines; it must occur exactly once. The replacement is re-indented to the first
matched line's indentation, keeping its own relative indentation.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sglfix.common.errors import PatchApplicationError

__all__ = ["SourceOrigin", "apply_edits", "apply_single_edit", "find_match_positions"]


class _EditLike(Protocol):
    match: str
    replacement: str
    prepend: str
    append: str


@dataclass(frozen=True)
class SourceOrigin:
    """Where a source text comes from, so messages can cite real file lines."""

    target: str = "<source>"
    filename: str = "<unknown>"
    first_lineno: int = 1

    def where(self, index: int) -> str:
        return f"{self.filename}:{self.first_lineno + index}"


def apply_edits(*, source: str, edits: Iterable[_EditLike], origin: SourceOrigin | None = None) -> str:
    """Apply edits in order; each one sees the result of the previous ones."""
    origin = origin or SourceOrigin()
    result = source
    for number, edit in enumerate(edits, start=1):
        result = apply_single_edit(source=result, edit=edit, origin=origin, number=number)
    return result


def effective_replacement(*, edit: _EditLike) -> str:
    match_text = edit.match.strip()
    if edit.prepend.strip():
        return edit.prepend.strip() + "\n" + match_text
    if edit.append.strip():
        return match_text + "\n" + edit.append.strip()
    return edit.replacement.strip()


def apply_single_edit(*, source: str, edit: _EditLike, origin: SourceOrigin | None = None, number: int = 1) -> str:
    origin = origin or SourceOrigin()
    match_text = edit.match.strip()
    if not match_text:
        raise PatchApplicationError(f"{origin.target}: edit #{number} has an empty match text")
    source_lines = source.splitlines()
    match_lines = match_text.splitlines()
    positions = find_match_positions(source_lines=source_lines, match_lines=match_lines)
    if not positions:
        raise PatchApplicationError(
            _not_found_message(source_lines=source_lines, match_lines=match_lines, origin=origin, number=number)
        )
    if len(positions) > 1:
        where = ", ".join(origin.where(p) for p in positions)
        raise PatchApplicationError(
            f"{origin.target}: edit #{number}: match text found {len(positions)} times "
            f"(at {where}); it must occur exactly once: add a neighbouring line to the match\n"
            + _indent_block(match_lines)
        )
    start = positions[0]
    indent = _leading_spaces(source_lines[start])
    replacement = effective_replacement(edit=edit)
    replacement_lines = replacement.splitlines() if replacement else []
    new_lines = source_lines[:start] + _realign(replacement_lines, indent) + source_lines[start + len(match_lines) :]
    return "\n".join(new_lines) + ("\n" if source.endswith("\n") else "")


def find_match_positions(*, source_lines: list[str], match_lines: list[str]) -> list[int]:
    stripped_source = [line.strip() for line in source_lines]
    stripped_match = [line.strip() for line in match_lines]
    n = len(stripped_match)
    first = stripped_match[0] if stripped_match else None
    return [
        i
        for i in range(len(stripped_source) - n + 1)
        if stripped_source[i] == first and stripped_source[i : i + n] == stripped_match
    ]


def _realign(lines: list[str], indent: int) -> list[str]:
    non_empty = [line for line in lines if line.strip()]
    if not non_empty:
        return []
    base = _leading_spaces(non_empty[0])
    out: list[str] = []
    for line in lines:
        if not line.strip():
            out.append("")
            continue
        cut = min(base, len(line) - len(line.lstrip()))
        out.append(" " * indent + line[cut:])
    return out


def _leading_spaces(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _indent_block(lines: list[str], prefix: str = "    | ") -> str:
    return "\n".join(prefix + line.strip() for line in lines)


def closest_windows(*, source_lines: list[str], match_lines: list[str], limit: int = 2) -> list[tuple[int, float]]:
    """Start indices of the source windows most similar to the match, best first."""
    stripped_source = [line.strip() for line in source_lines]
    stripped_match = [line.strip() for line in match_lines]
    n = max(1, len(stripped_match))
    scored: list[tuple[float, int]] = []
    for i in range(max(1, len(stripped_source) - n + 1)):
        window = stripped_source[i : i + n]
        ratio = difflib.SequenceMatcher(None, "\n".join(window), "\n".join(stripped_match)).ratio()
        scored.append((ratio, i))
    scored.sort(key=lambda item: (-item[0], item[1]))
    chosen: list[tuple[int, float]] = []
    for ratio, i in scored:
        if ratio <= 0.3 or len(chosen) >= limit:
            break
        if all(abs(i - j) >= n for j, _ in chosen):
            chosen.append((i, ratio))
    return chosen


def _not_found_message(*, source_lines: list[str], match_lines: list[str], origin: SourceOrigin, number: int) -> str:
    head = (
        f"{origin.target}: edit #{number}: match text not found in the function "
        f"({origin.where(0)}, {len(source_lines)} lines): "
        f"its first line {match_lines[0].strip()!r} "
    )
    stripped = [line.strip() for line in source_lines]
    hits = stripped.count(match_lines[0].strip())
    head += f"occurs {hits} time(s)" if hits else "occurs nowhere"
    parts = [head, "  wanted:", _indent_block(match_lines)]
    windows = closest_windows(source_lines=source_lines, match_lines=match_lines)
    if not windows:
        parts.append("  no similar lines in the function")
    for start, ratio in windows:
        end = min(len(source_lines), start + len(match_lines))
        parts.append(
            f"  closest at {origin.where(start)}-{origin.first_lineno + end - 1} "
            f"({ratio:.0%} similar); - wanted, + found:"
        )
        diff = difflib.unified_diff(
            [line.strip() for line in match_lines],
            stripped[start:end],
            lineterm="",
            n=len(match_lines),
        )
        parts.extend("    " + line for line in list(diff)[3:])
    return "\n".join(parts)
