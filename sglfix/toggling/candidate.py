"""A candidate fix: a unified diff, not merged yet, applied to the installed code through the same
engine that reverts historical fixes (``run|matrix|bisect --apply FIX.patch``; ``SGLFIX_APPLY`` in
any process of an engine).

Applying a diff is reverting its reverse: the diff is turned around (its added lines become the
ones a revert would take out), mapped onto the installed functions by ``toggle from-diff``'s
planner, and checked the same way (every patched function equals the fixed function the diff
describes). A candidate then behaves like one more part of a toggle set: a ``Selection`` whose
id is ``+`` and the file's name (``+fix-headroom``), installed atomically with the set's reverts
and restored with them. It is applied before them: the code with the fix, then history reverted.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.toggling import APPLY_ENV  # a path list, as PATH is (os.pathsep between files)
from sglfix.toggling.ids import CANDIDATE_PREFIX, is_candidate_id
from sglfix.toggling.registry import Part

__all__ = [
    "APPLY_ENV",
    "CANDIDATE_PREFIX",
    "Candidate",
    "CandidateSelection",
    "is_candidate_id",
    "load_candidate",
    "load_candidates",
    "reverse_diff",
    "split_ids",
]


def split_ids(ids: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A toggle set's ids as (candidate fixes, reverts), each in the set's order."""
    ids = tuple(str(i) for i in ids)
    return tuple(i for i in ids if is_candidate_id(i)), tuple(i for i in ids if not is_candidate_id(i))


@dataclass(frozen=True)
class CandidateSelection:
    """A candidate fix where the engine takes a selected part of a toggle (``revert()``, the
    start-up hook, the precheck): same attributes, and the verb its messages use."""

    candidate: Candidate
    part: Part  # the fix's patches, as a toggle's part holds a revert's
    verb: str = "apply"

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def toggle(self) -> Candidate:
        return self.candidate


@dataclass(frozen=True)
class Candidate:
    """One candidate fix, mapped onto the installed code base and checked."""

    id: str  # "+" and the file's stem
    path: str  # absolute
    sha256: str  # of the file's bytes: a worker applies exactly what the parent checked
    title: str
    package: str
    part: Part = field(repr=False)
    notes: tuple[str, ...] = ()  # what the diff holds that is left alone, one line each
    text: str = field(default="", repr=False)
    url: str = ""

    @property
    def functions(self) -> tuple[str, ...]:
        """The functions it patches."""
        return self.part.targets

    @property
    def selection(self) -> CandidateSelection:
        return CandidateSelection(self, self.part)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "path": self.path,
            "sha256": self.sha256,
            "title": self.title,
            "url": self.url,
            "functions": list(self.functions),
            "notes": list(self.notes),
        }


def candidate_id(path: str | os.PathLike) -> str:
    """``+`` and the file's stem in the id grammar's part-name letters (``Fix_PS1.patch`` ->
    ``+fix_ps1``)."""
    stem = Path(path).name
    for suffix in (".patch", ".diff"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-") or "fix"
    if not name[0].isalpha():
        name = "fix-" + name
    return CANDIDATE_PREFIX + name


def reverse_diff(text: str, *, where: str) -> tuple[Any, str]:
    """The diff's header and its reverse as unified-diff text: each hunk's removed lines become
    added ones and the other way round, its ranges swapped."""
    from sglfix.toggling.diffread import parse_diff

    header, files = parse_diff(text, where=where)
    out: list[str] = []
    for pf in files:
        if pf.is_binary_file:
            raise ConfigError(
                f"{where}: {pf.path} is a binary file: sglfix applies a fix to functions of Python modules"
            )
        old = "/dev/null" if pf.is_added_file else f"a/{pf.path}"
        new = "/dev/null" if pf.is_removed_file else f"b/{pf.path}"
        # Reversed: the fixed file is the old side, the installed one the new side.
        out.append(f"--- {new}\n+++ {old}\n")
        for hunk in pf:
            section = f" {hunk.section_header}" if hunk.section_header else ""
            out.append(
                f"@@ -{hunk.target_start},{hunk.target_length} +{hunk.source_start},{hunk.source_length} @@{section}\n"
            )
            for line in hunk:
                kind = {"+": "-", "-": "+"}.get(line.line_type, line.line_type)
                value = line.value if line.value.endswith("\n") else line.value + "\n"
                out.append(kind + value if kind != "\\" else "\\ No newline at end of file\n")
    return header, "".join(out)


# The planner speaks of reverting the diff it is given; given the reverse, its words are turned
# back to the fix's direction here (first match wins).
_WORDS = (
    (
        "does not apply to the installed code",
        True,
        "does not apply to the installed code: the lines it changes are not there (was the fix written "
        "against another version of the code?)",
    ),
    (
        "the fix deletes this file",
        True,
        "adds a new file: sglfix applies a fix as changes to functions of modules the code base has",
    ),
    ("a new file:", False, "deletes the file: left in place (only the changes to functions are applied)"),
    (
        "a module-level change",
        True,
        "a module-level change (outside any function, such as a new helper or import): sglfix applies a fix "
        "as changes inside existing functions; move the new code into the function that uses it",
    ),
    (
        "a class-level change",
        True,
        "a class-level change (an attribute, not a method): sglfix applies a fix as changes inside existing "
        "functions; move the new code into the function that uses it",
    ),
    ("a new top-level definition", False, "removes a top-level definition: left in place"),
    ("a new helper", False, "removes a top-level definition: left in place"),
    ("an added import", False, "removes an import: left in place"),
    ("changes the signature", False, None),
)


def _words(why: str, blocking: bool) -> tuple[str, bool]:
    for start, block, text in _WORDS:
        if start in why:
            if text is None:  # the planner's own words hold in both directions, once these are turned
                text = why.replace(
                    "the revert gives back the old one, and callers the fix changed are reverted",
                    "callers are patched",
                )
            return text, block
    return why, blocking


def load_candidate(path: str | os.PathLike, *, codebase: Any) -> Candidate:
    """The candidate fix in the diff at ``path``, mapped onto ``codebase``'s installed source and
    checked (each patched function applies and equals the fixed one the diff describes; where it
    may be patched is the runner's precheck, as for a revert), or a one-line ConfigError naming
    the file and what to do."""
    from sglfix.common.codebase import package_dir
    from sglfix.common.yamlio import read_text_file
    from sglfix.patching.types import PatchSpec
    from sglfix.toggling.diffread import DIFF_WANTED
    from sglfix.toggling.fromdiff import MAX_DIFF_BYTES, check, plan

    shown = os.fspath(path)
    where = f"--apply {shown}"
    p = Path(shown)
    text = read_text_file(shown, what="--apply file", max_bytes=MAX_DIFF_BYTES, give=DIFF_WANTED)
    raw = text.encode()
    header, reverse = reverse_diff(text, where=where)
    root = package_dir(codebase.package)
    if root is None:
        raise ConfigError(
            f"{where}: {codebase.package} is not installed here; the fix is applied to its installed source"
        )
    mapped = plan(
        reverse,
        where=where,
        pr=1,
        package=codebase.package,
        repo_prefix=codebase.repo_prefix,
        source_root=Path(root),
        header=header,
    )
    notes: list[str] = []
    refusals: list[str] = []
    for note in mapped.notes:
        why, blocking = _words(note.why, note.blocking)
        (refusals if blocking else notes).append(f"{note.where}: {why}")
    if refusals:
        more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
        raise ConfigError(f"{where}: {refusals[0]}{more}")
    if not mapped.reverts:
        raise ConfigError(f"{where}: changes no function of {codebase.package}; nothing to apply")
    problems = check(mapped, package=codebase.package, source_root=Path(root))
    if problems:
        raise ConfigError(
            f"{where}: {problems[0].replace('the revert does not give the pre-fix', 'applying it does not give the fixed')}"
        )
    cid = candidate_id(shown)
    patches = tuple(PatchSpec(target=r.target, edits=tuple(r.edits)) for r in mapped.reverts)
    title = header.title or f"candidate fix {p.name}"
    return Candidate(
        id=cid,
        path=str(p.resolve()),
        sha256=hashlib.sha256(raw).hexdigest(),
        title=title,
        url=header.url,
        package=codebase.package,
        part=Part(name=cid, summary=title, patches=patches),
        notes=tuple(notes),
        text=text,
    )


def load_candidates(paths: Any, *, codebase: Any, load: Any = load_candidate) -> tuple[Candidate, ...]:
    """Each ``--apply`` file as a candidate (``load`` reads one); two that would share an id are
    refused."""
    out: dict[str, Candidate] = {}
    for path in paths:
        cand = load(path, codebase=codebase)
        if cand.id in out:
            raise ConfigError(
                f"--apply {path}: its id {cand.id} is taken by {out[cand.id].path}; rename one of the files"
            )
        out[cand.id] = cand
    return tuple(out.values())


# Candidates this process has mapped, by file, content and code base: a worker applies the same
# fix at every switch to a patched set, and mapping a diff reads and parses the installed files.
_MAPPED: dict[tuple[str, str, str], Candidate] = {}


def _load_once(path: str | os.PathLike, *, codebase: Any) -> Candidate:
    try:
        key = (os.path.realpath(path), hashlib.sha256(Path(path).read_bytes()).hexdigest(), codebase.package)
    except OSError:
        return load_candidate(path, codebase=codebase)  # says in one line what is wrong with the file
    if key not in _MAPPED:
        _MAPPED[key] = load_candidate(path, codebase=codebase)
    return _MAPPED[key]


def from_env(value: str | None, *, codebase: Any, expected: Any = None) -> list:
    """The selections ``SGLFIX_APPLY`` (fix files, ``os.pathsep`` between them) makes in this
    process; ``expected``: id -> sha256 the files must still have (a worker applies what its
    parent checked)."""
    if value is None or not value.strip():
        return []
    paths = [s for s in value.split(os.pathsep) if s.strip()]
    try:
        cands = load_candidates(paths, codebase=codebase, load=_load_once)
    except ConfigError as exc:
        raise ConfigError(f"{APPLY_ENV}: {str(exc).removeprefix('--apply ')}") from None
    for c in cands:
        want = (expected or {}).get(c.id)
        if want is not None and want != c.sha256:
            raise ConfigError(f"{APPLY_ENV}: {c.path} changed since the run started; run again")
    return [c.selection for c in cands]
