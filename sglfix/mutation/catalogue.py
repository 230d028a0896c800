"""The catalogue as a check of the operators: every part of every toggle reverts a real fix, so
the pre-fix function is a bug someone shipped; each should be one generated mutant of the same
function (``exact``), or at least a mutant that changes one of the lines the revert changes
(``close``). Parts no mutant comes near (``none``) name the operator that is missing.

Everything is read from source: the toggle's edits are applied to the function's text with the
patching engine's editor (as ``doctor --source`` does), the mutants are made from the file's
text, and the two are compared by their code (the parsed function, a ``pass`` standing for a
deleted statement), not by running anything.
"""

from __future__ import annotations

import ast
import difflib
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sglfix.common.errors import SglfixError
from sglfix.mutation.model import Mutant

__all__ = ["CatalogueRow", "catalogue_counts", "check_catalogue", "locate_function", "patched_source"]

Match = Literal["exact", "close", "none"]


class CatalogueRow(BaseModel):
    """One function of one toggle part: how near the generated mutants come to its revert."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toggle: str  # the part's id: "26651:clamp"
    function: str  # the dotted function the part reverts
    match: Match
    mutant: str | None = None  # the best mutant's id (exact, else the closest touching mutant)
    operator: str | None = None
    change: str  # the revert's first changed line, "old -> new" (or why nothing was compared)
    at: str | None = None  # path:line of that line, as the code base's repository names the file


def catalogue_counts(rows: Sequence[CatalogueRow]) -> dict[str, int]:
    """How many rows are exact, close and none."""
    out = {"exact": 0, "close": 0, "none": 0}
    for r in rows:
        out[r.match] += 1
    return out


class _NoPass(ast.NodeTransformer):
    """A ``pass`` beside other statements is no statement: a mutant writes ``pass`` where a revert
    deletes the line."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts:
                kept = [s for s in stmts if not isinstance(s, ast.Pass)]
                # A body needs a statement; an else or finally of only pass is none.
                setattr(node, name, kept or ([] if name != "body" else stmts[:1]))
        return node


def _code(source: str) -> str | None:
    """The function's code, as a comparable text (None when it does not parse)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not tree.body:
        return None
    return ast.dump(_NoPass().visit(tree.body[0]))


def _code_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(index, text without whitespace) of the lines that hold code (no blank or comment lines)."""
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s and not s.startswith("#"):
            out.append((i, "".join(s.split())))
    return out


def _short(text: str, width: int = 70) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 3] + "..."


def _first_change(fixed: list[str], reverted: list[str]) -> tuple[set[int], str, int | None]:
    """The indices of the fixed function's code lines the revert changes, its first change as
    "old -> new" and the index of that line (of the line before an insertion)."""
    a, b = _code_lines(fixed), _code_lines(reverted)
    ops = difflib.SequenceMatcher(None, [t for _, t in a], [t for _, t in b], autojunk=False).get_opcodes()
    changed: set[int] = set()
    first: tuple[str, int | None] | None = None
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        changed.update(a[i][0] for i in range(i1, i2))
        if first is None:
            old = fixed[a[i1][0]].strip() if i1 < i2 else "(nothing)"
            new = reverted[b[j1][0]].strip() if j1 < j2 else "(deleted)"
            more = max(i2 - i1, j2 - j1) - 1
            tail = f" (+{more} more lines)" if more > 0 else ""
            at = a[i1][0] if i1 < i2 else (a[i1 - 1][0] if i1 > 0 else None)
            first = (f"{_short(old)} -> {_short(new)}{tail}", at)
    if first is None:
        return changed, "the revert changes no code line (comments or blank lines only)", None
    return changed, first[0], first[1]


def _new_lines(fixed: list[str], reverted: list[str]) -> list[str]:
    """The reverted function's lines that replace or add to the fixed function's."""
    ops = difflib.SequenceMatcher(None, [s.strip() for s in fixed], [s.strip() for s in reverted], autojunk=False)
    return [reverted[j].strip() for tag, _, _, j1, j2 in ops.get_opcodes() if tag != "equal" for j in range(j1, j2)]


def locate_function(target: str, package: str, source_root: Path) -> tuple[Path, str, str, int]:
    """(file, qualname, function source, its first line) of ``target`` under ``source_root``,
    found as ``doctor --source`` finds a toggle's target."""
    from sglfix.toggling.doctor import locate_in

    rel = target[len(package) + 1 :].split(".")
    filename, source, first = locate_in(source_root, rel, target)
    path = Path(filename)
    module = list(path.relative_to(source_root).with_suffix("").parts)
    if module and module[-1] == "__init__":
        module = module[:-1]
    return path, ".".join(rel[len(module) :]), source, first


def patched_source(source: str, patches: Sequence[Any], *, filename: str, first: int) -> str:
    """``source`` (a function's, from line ``first`` of ``filename``) with each patch's text edits
    made in order, as the workers make them; PatchApplicationError where one does not apply."""
    from sglfix.patching.editor import SourceOrigin, apply_edits

    for patch in patches:
        origin = SourceOrigin(target=patch.target, filename=filename, first_lineno=first)
        source = apply_edits(source=source, edits=patch.edits, origin=origin)
    return source


def _mutated_source(fixed: list[str], m: Mutant, first: int) -> str:
    lines = fixed[: m.line - first] + m.mutated.split("\n") + fixed[m.end_line - first + 1 :]
    return "\n".join(lines) + "\n"


def _row_for(
    sel_id: str,
    target: str,
    patches: Sequence[Any],
    *,
    package: str,
    source_root: Path,
    repo_prefix: str,
    operators: Sequence[str] | None,
    cache: dict[Path, str],
) -> CatalogueRow:
    from sglfix.mutation.operators import mutants_of_function

    def none(why: str, at: str | None = None) -> CatalogueRow:
        return CatalogueRow(toggle=sel_id, function=target, match="none", change=why, at=at)

    if not target.startswith(package + "."):
        return none(f"not a function of {package}: nothing to mutate")
    try:
        path, qualname, source, first = locate_function(target, package, source_root)
        repo_path = repo_prefix + path.relative_to(source_root).as_posix()
        reverted = patched_source(source, patches, filename=repo_path, first=first)
    except SglfixError as exc:
        # The file as the code base's repository names it, not where it lies on this machine.
        why = str(exc).splitlines()[0].replace(str(source_root) + os.sep, repo_prefix)
        return none(f"not compared: {why}")
    if path not in cache:
        cache[path] = path.read_text(encoding="utf-8")
    fixed = source.splitlines()
    changed_idx, change, at_idx = _first_change(fixed, reverted.splitlines())
    at = f"{repo_path}:{first + at_idx}" if at_idx is not None else None
    changed = {first + i for i in changed_idx}
    want = _code(reverted)
    try:
        mutants = mutants_of_function(
            cache[path], qualname=qualname, function=target, path=repo_path, operators=operators
        )
    except SglfixError as exc:
        return none(f"no mutants: {str(exc).splitlines()[0]}", at)
    # What the revert writes in place of the lines it changes: the closest mutant writes the most
    # like it there.
    new_text = " ".join(_new_lines(fixed, reverted.splitlines())) or "pass"  # a deletion reads as pass
    best: tuple[float, Mutant] | None = None
    for m in mutants:
        if not changed & set(range(m.line, m.end_line + 1)):
            continue  # a mutant that leaves the revert's lines alone is neither the revert nor near it
        if want is not None and _code(_mutated_source(fixed, m, first)) == want:
            return CatalogueRow(
                toggle=sel_id, function=target, match="exact", mutant=m.id, operator=m.operator, change=change, at=at
            )
        mutated = " ".join(s.strip() for s in m.mutated.split("\n"))
        ratio = difflib.SequenceMatcher(None, mutated, new_text).ratio()
        if best is None or ratio > best[0]:
            best = (ratio, m)
    if best is not None:
        m = best[1]
        return CatalogueRow(
            toggle=sel_id, function=target, match="close", mutant=m.id, operator=m.operator, change=change, at=at
        )
    return none(change, at)


def check_catalogue(
    *,
    registry: Any,
    package: str,
    source_root: Path,
    repo_prefix: str,
    operators: Sequence[str] | None = None,
) -> list[CatalogueRow]:
    """One row per function of every part of every toggle of ``registry`` (a part with no revert
    at this version has none), comparing its revert with the mutants of the same function of the
    source under ``source_root`` (the installed ``package``, whose files the code base's
    repository keeps under ``repo_prefix``)."""
    from sglfix.mutation.operators import check_operators
    from sglfix.toggling.registry import Selection

    check_operators(operators)
    root = Path(source_root)
    cache: dict[Path, str] = {}
    rows: list[CatalogueRow] = []
    for toggle in registry:
        for part in toggle.parts.values():
            if part.absent:
                continue
            sel_id = Selection(toggle, part).id
            for target in part.targets:
                patches = [p for p in part.patches if p.target == target]
                rows.append(
                    _row_for(
                        sel_id,
                        target,
                        patches,
                        package=package,
                        source_root=root,
                        repo_prefix=repo_prefix,
                        operators=operators,
                        cache=cache,
                    )
                )
    return rows
