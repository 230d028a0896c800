"""The plan of a ``toggle from-diff``: every hunk of the fix mapped to the function it changes in
the installed source, and what cannot be a function revert kept as a ``Note`` (blocking: a
refusal; else said and left alone)."""

from __future__ import annotations

import ast
import functools
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.patching.types import EditSpec
from sglfix.toggling.diffedits import Function, NoAnchor, defined_names, enclosing, functions_of, revert_edits
from sglfix.toggling.diffread import Change, PatchHeader, hunk_changes, hunk_name, locate_hunk, parse_diff

__all__ = ["FunctionRevert", "Note", "Plan", "plan"]


@dataclass
class FunctionRevert:
    target: str  # module.qualname
    qualname: str
    path: str  # the file as the diff names it
    edits: list[EditSpec]
    pre_source: str  # the function before the fix, as the diff says it was
    hunks: list[str] = field(default_factory=list)


@dataclass
class Note:
    where: str
    why: str
    blocking: bool


@dataclass
class Plan:
    pr: int
    header: PatchHeader
    reverts: list[FunctionRevert]
    notes: list[Note]
    added_files: list[str] = field(default_factory=list)  # files the fix creates (nothing to revert)
    files: int = 0  # files the diff names

    @property
    def refusals(self) -> list[Note]:
        return [n for n in self.notes if n.blocking]

    @property
    def only_adds_files(self) -> bool:
        """The diff only creates files: nothing existed before the fix, so no function to revert."""
        return bool(self.added_files) and len(self.added_files) == self.files


def plan(
    text: str,
    *,
    where: str,
    pr: int,
    package: str,
    repo_prefix: str,
    source_root: Path,
    header: PatchHeader | None = None,
) -> Plan:
    """Map every hunk of the diff in ``text`` to a function revert of ``package`` (installed at
    ``source_root``; the diff's paths start with ``repo_prefix``). Nothing is refused here by
    raising except a diff that is not one, or one that changes no code at all: what cannot be a
    function revert becomes a blocking ``Note`` (the caller prints them all, one per line).
    ``header``, when given, is the fix's metadata (a commit read from git); else it is read from
    the text before the diff."""
    parsed, files = parse_diff(text, where=where)
    header = parsed if header is None else header
    notes: list[Note] = []
    reverts: list[FunctionRevert] = []
    added: list[str] = []
    comment_only = 0  # files whose every change is to comments or docstrings
    for pf in files:
        path = pf.path
        # 'a/./x.py' or 'a/pkg/../pkg/x.py' names the same file as 'a/x.py' and must map the same;
        # one that climbs past the top names nothing of the checkout.
        normal = posixpath.normpath(path)
        if normal == ".." or normal.startswith("../"):
            notes.append(
                Note(
                    path,
                    "climbs above the repository's root ('..' past its top); give paths relative to the "
                    "checkout, as git diff writes them",
                    True,
                )
            )
            continue
        path = normal
        if pf.is_binary_file:
            notes.append(Note(path, "a binary file: no function to revert", True))
            continue
        if not path.endswith(".py"):
            notes.append(Note(path, "not a Python file: sglfix reverts functions of Python modules", True))
            continue
        if not path.startswith(repo_prefix):
            notes.append(Note(path, f"outside the code base (its paths start with {repo_prefix})", True))
            continue
        rel = path[len(repo_prefix) :]
        module = ".".join([package, *rel[: -len(".py")].split("/")])
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        if pf.is_added_file:
            added.append(path)
            notes.append(
                Note(
                    path,
                    "a new file: nothing existed before the fix; the reverted functions are checked not to need it",
                    False,
                )
            )
            continue
        if pf.is_removed_file:
            notes.append(Note(path, "the fix deletes this file: a revert would have to bring a module back", True))
            continue
        installed = source_root / rel
        if not installed.is_file():
            notes.append(Note(path, f"not in the installed code base (looked for {installed})", True))
            continue
        post = installed.read_text().splitlines()
        file_reverts, no_code = _plan_file(pf, path=path, module=module, post=post, notes=notes)
        reverts += file_reverts
        comment_only += no_code
    if comment_only and comment_only == len(files):
        # A revert of such a diff would leave every function's code as it is: no toggle to write.
        raise ConfigError(
            f"{where} changes no code (only comments or docstrings): a revert of it would change nothing; "
            f"give the diff of the fix's code change"
        )
    return Plan(pr=pr, header=header, reverts=reverts, notes=notes, added_files=added, files=len(files))


@dataclass
class _FileState:
    """One file of the diff while it is planned: the installed code, and what each change of
    the fix has been sorted into."""

    path: str
    post: list[str]
    tree: ast.Module
    notes: list[Note]
    functions: list = field(default_factory=list)
    top: dict = field(default_factory=dict)
    post_code: str | None = None
    per_function: dict[str, list[Change]] = field(default_factory=dict)
    hunks_of: dict[str, list[str]] = field(default_factory=dict)
    new_defs: list[tuple[str, str]] = field(default_factory=list)  # (name, hunk) of top-level definitions added


def _plan_file(
    pf: Any, *, path: str, module: str, post: list[str], notes: list[Note]
) -> tuple[list[FunctionRevert], bool]:
    """The function reverts of one file of the diff, and whether every change the fix makes to
    it is to comments or docstrings only (then it gives no revert)."""
    try:
        tree = ast.parse("\n".join(post) + "\n")
    except SyntaxError as exc:
        notes.append(Note(path, f"the installed file does not parse (line {exc.lineno}): {exc.msg}", True))
        return [], False
    said: list[Note] = []  # this file's notes, kept apart until it is known to change code
    st = _FileState(path=path, post=post, tree=tree, notes=said)
    st.functions, st.top = functions_of(tree), defined_names(tree)
    placed = _place_hunks(pf, path=path, post=post, notes=said)
    st.post_code = _code("\n".join(post) + "\n")
    every = [c for _, changes in placed for c in changes]
    for name, changes in placed:
        for change in changes:
            _sort_change(st, name, change)
    reverts = _function_reverts(st, module=module)
    # A function revert is a change of code: the whole file (parsed once more, the costly step
    # for a file's many diffs) is compared only when none was found.
    if not reverts and len(placed) == len(pf) and every and _same_code(st.post_code, _undo(post, every)):
        notes.append(Note(path, "changes only comments or docstrings: nothing of it to revert", False))
        return [], True
    _note_new_defs(st)
    notes.extend(said)
    return reverts, False


def _place_hunks(pf: Any, *, path: str, post: list[str], notes: list[Note]) -> list[tuple[str, list[Change]]]:
    """Each hunk's changes placed in the installed file; a hunk whose post-fix lines are not
    there is a note that refuses the diff."""
    placed = []
    for hunk in pf:
        name = hunk_name(path, hunk)
        start = locate_hunk(hunk, post)
        if start is None:
            notes.append(
                Note(
                    name,
                    "does not apply to the installed code: its post-fix lines are not there "
                    "(is the code base the fixed version?)",
                    True,
                )
            )
            continue
        placed.append((name, hunk_changes(hunk, start, name)))
    return placed


def _sort_change(st: _FileState, name: str, change: Change) -> None:
    """One change of the fix: inside a function (reverted with it), a new top-level definition,
    an added import, a comment or docstring (left alone), or something no revert can undo."""
    post, notes = st.post, st.notes
    first = change.at
    last = change.at + max(len(change.post), 1) - 1
    if not change.post:  # a pure deletion sits between two lines: inside a function if both are
        first, last = change.at - 1, change.at
    func = enclosing(st.functions, first, last)
    if func is not None:
        if first <= func.node.body[0].lineno - 2:
            notes.append(
                Note(
                    name,
                    f"changes the signature of {func.qualname}: the revert gives back the old one, and "
                    "callers the fix changed are reverted only if their hunks are in this diff",
                    False,
                )
            )
        st.per_function.setdefault(func.qualname, []).append(change)
        hunks = st.hunks_of.setdefault(func.qualname, [])
        if name not in hunks:
            hunks.append(name)
        return

    def blank_or(test) -> bool:  # every line of the change passes ``test`` or is blank
        return all(test(i) or not post[i].strip() for i in range(first, last + 1))

    added = [n for n, (a, b) in st.top.items() if change.post and first <= a and b <= last]
    if added and not change.pre and blank_or(lambda i: _inside_any(st.top, i)):
        st.new_defs += [(n, name) for n in added]
    elif not change.pre and blank_or(lambda i: _is_import(post[i])):
        notes.append(
            Note(
                name,
                "an added import at module level: left in place, a reverted function "
                "that does not use it is unaffected",
                False,
            )
        )
    elif _same_code(st.post_code, _undo(post, [change])):
        notes.append(Note(f"{name} (line {first + 1})", "changes only comments or docstrings: left as it is", False))
    else:
        notes.append(Note(f"{name} (line {first + 1})", _outside_why(st.tree, first), True))


def _function_reverts(st: _FileState, *, module: str) -> list[FunctionRevert]:
    reverts = []
    for qualname, changes in st.per_function.items():
        func = next(f for f in st.functions if f.qualname == qualname)
        if _same_function(st, func, changes):
            # Its revert would be a part that changes no behaviour: a matrix column of noise.
            st.notes.append(Note(f"{st.path}: {qualname}", "changes only comments or docstrings: not reverted", False))
            continue
        try:
            edits, pre_source = revert_edits(func, changes, st.post)
        except NoAnchor as exc:
            st.notes.append(Note(f"{st.path}: {qualname}", str(exc), True))
            continue
        reverts.append(
            FunctionRevert(
                target=f"{module}.{qualname}",
                qualname=qualname,
                path=st.path,
                edits=edits,
                pre_source=pre_source,
                hunks=st.hunks_of[qualname],
            )
        )
    return reverts


def _note_new_defs(st: _FileState) -> None:
    changed = set(st.per_function)
    for helper, name in st.new_defs:
        users = _users(st.tree, helper, st.functions, exclude=changed)
        if users:
            st.notes.append(
                Note(
                    name,
                    f"a new top-level definition {helper!r}, also used by {', '.join(users)} "
                    f"which the fix does not change: reverting only the changed functions "
                    f"would leave those calling it",
                    True,
                )
            )
        else:
            st.notes.append(
                Note(
                    name,
                    f"a new helper {helper!r}: needs no revert of its own, only the changed functions use it",
                    False,
                )
            )


def _undo(post: list[str], changes: list[Change]) -> str:
    """The file with ``changes`` undone (each placed in ``post``), bottom to top."""
    lines = list(post)
    for c in sorted(changes, key=lambda c: c.at, reverse=True):
        lines[c.at : c.at + len(c.post)] = c.pre
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=32)
def _code(source: str) -> str | None:
    """The module's code without its comments and docstrings (None when it does not parse):
    two sources with the same one differ in nothing the interpreter runs. Remembered: many
    diffs of one file (a mutation campaign's) compare against the same installed text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:]
    return ast.dump(tree)


def _same_function(st: _FileState, func: Function, changes: list[Change]) -> bool:
    """Whether ``changes`` (all inside ``func``) leave its code as it is (comments, docstrings):
    the function's text alone parsed both ways, not the whole file (a file's many diffs, as a
    mutation campaign's, each cost a parse of one function); the whole file where a function's
    text does not parse alone."""
    import textwrap

    start, end = func.node.lineno - 1, func.node.end_lineno
    lines = list(st.post)
    for c in sorted(changes, key=lambda c: c.at, reverse=True):
        lines[c.at : c.at + len(c.post)] = c.pre
    delta = sum(len(c.pre) - len(c.post) for c in changes)
    before = _code(textwrap.dedent("\n".join(st.post[start:end])) + "\n")
    if before is None:
        return _same_code(st.post_code, _undo(st.post, changes))
    return before == _code(textwrap.dedent("\n".join(lines[start : end + delta])) + "\n")


def _same_code(post_code: str | None, pre_source: str) -> bool:
    return post_code is not None and post_code == _code(pre_source)


def _inside_any(top: dict[str, tuple[int, int]], i: int) -> bool:
    return any(a <= i <= b for a, b in top.values())


def _is_import(line: str) -> bool:
    s = line.strip()
    return (
        s.startswith(("import ", "from "))
        or s in (")",)
        or (s.endswith(",") and s.replace(",", "").replace("_", "").replace(" ", "").isalnum())
    )


def _outside_why(tree: ast.Module, line: int) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.lineno - 1 <= line <= (node.end_lineno or node.lineno) - 1:
            return f"a class-level change in {node.name} (an attribute, not a method): not a function revert"
    return "a module-level change (outside any function): not a function revert"


def _users(tree: ast.Module, name: str, functions: list[Function], *, exclude: set[str]) -> list[str]:
    """Functions other than ``exclude`` (and the helper itself) whose code names ``name``."""
    users = []
    for f in functions:
        if f.qualname in exclude or f.qualname == name:
            continue
        if any(
            (isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.Attribute) and n.attr == name)
            for n in ast.walk(f.node)
        ):
            users.append(f.qualname)
    return users
