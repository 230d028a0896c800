"""A fix's unified diff turned into a revert toggle: each hunk mapped to the function it changes in
the code base's installed (post-fix) source, each change a ``match`` (the post-fix lines, widened
to the smallest anchor that occurs once in the function) and a ``replacement`` (the pre-fix
lines). ``plan()`` does the mapping on the host and refuses what cannot be a function revert;
``check()`` applies the result to the installed source and compares every reverted function with
the pre-fix function the diff describes, before anything is written.
"""

from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.patching.editor import apply_single_edit, find_match_positions
from sglfix.patching.types import EditSpec

__all__ = [
    "Change",
    "FunctionRevert",
    "Note",
    "PatchHeader",
    "Plan",
    "check",
    "commit_header",
    "parse_diff",
    "plan",
    "to_yaml",
]

MAX_DIFF_BYTES = 4 * 1024 * 1024
_URL_RE = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/pull/\d+")


@dataclass
class PatchHeader:
    title: str = ""
    description: str = ""
    url: str = ""
    commit: str = ""


@dataclass
class Change:
    """One run of changed lines of a hunk: ``post`` the fix's lines, ``pre`` the lines before it;
    ``at`` the 0-based index in the post-fix file where ``post`` starts (or would, when empty)."""

    at: int
    post: list[str]
    pre: list[str]
    hunk: str  # "path @@ -a,b +c,d @@", for messages


@dataclass
class Function:
    qualname: str  # Class.method or function, as a patch target names it after the module
    start: int  # 0-based first line (decorators included)
    end: int  # 0-based last line, inclusive
    node: Any = None


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

    @property
    def refusals(self) -> list[Note]:
        return [n for n in self.notes if n.blocking]


# ----------------------------------------------------------------------------- the diff


def parse_diff(text: str, *, where: str) -> tuple[PatchHeader, Any]:
    """The header (``git format-patch`` / ``git show`` / none) and the files of a unified diff."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    if not text.strip():
        raise ConfigError(
            f"{where} is empty; give the fix's diff (the output of git show, git format-patch or diff -u)"
        )
    try:
        files = PatchSet(text)
    except UnidiffParseError as exc:
        raise ConfigError(
            f"{where} is not a unified diff that parses ({exc}); give the output of git show, "
            f"git format-patch or diff -u"
        ) from None
    if not len(files):
        raise ConfigError(
            f"{where} is not a unified diff (no ---/+++ file headers); give the output of git show, "
            f"git format-patch or diff -u"
        )
    return _header(text), files


def _header(text: str) -> PatchHeader:
    head = re.split(r"^(?:diff --git |--- )", text, maxsplit=1, flags=re.M)[0]
    header = PatchHeader()
    m = re.search(r"^commit ([0-9a-f]{7,40})", head, re.M) or re.search(r"^From ([0-9a-f]{40}) ", head, re.M)
    if m:
        header.commit = m.group(1)
    m = re.search(r"^Subject: (?:\[[^\]]*\]\s*)?(.+(?:\n [^\n]+)*)", head, re.M)
    if m:  # format-patch: the subject may be folded over several lines
        header.title = " ".join(part.strip() for part in m.group(1).splitlines())
        body = head[m.end() :]
    else:  # git show: the message is indented by four spaces after the Date line
        message = [line[4:] for line in head.splitlines() if line.startswith("    ")]
        header.title = message[0].strip() if message else ""
        body = "\n".join(message[1:])
    body = body.split("\n---\n", 1)[0]  # format-patch's diffstat follows the message
    header.description = "\n".join(line.rstrip() for line in body.strip().splitlines()).strip()
    m = _URL_RE.search(head)
    if m:
        header.url = m.group(0)
    return header


def commit_header(commit: str, subject: str, body: str) -> PatchHeader:
    """The header of a commit read from git (``%H``, ``%s``, ``%b``) rather than from a patch's
    mail header: the title is the subject, as ``format-patch`` would give it less its ``[PATCH]``."""
    description = "\n".join(line.rstrip() for line in body.strip().splitlines()).strip()
    m = _URL_RE.search(subject + "\n" + body)
    return PatchHeader(title=subject.strip(), description=description, url=m.group(0) if m else "", commit=commit)


# ----------------------------------------------------------------------------- functions


def _functions(tree: ast.Module) -> list[Function]:
    """Every patchable function: module-level functions and methods of (nested) classes; a
    function nested inside another is part of its outer function's source."""
    out: list[Function] = []

    def walk(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                out.append(Function(prefix + node.name, start, node.end_lineno - 1, node))
            elif isinstance(node, ast.ClassDef):
                walk(node.body, prefix + node.name + ".")

    walk(tree.body, "")
    return out


def _enclosing(functions: list[Function], first: int, last: int) -> Function | None:
    for f in functions:
        if f.start <= first and last <= f.end:
            return f
    return None


def _defined_names(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """Top-level functions and classes: name -> (first, last) 0-based lines."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            out[node.name] = (start, node.end_lineno - 1)
    return out


# ----------------------------------------------------------------------------- the plan


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
    return Plan(pr=pr, header=header, reverts=reverts, notes=notes)


def _hunk_name(path: str, hunk: Any) -> str:
    return f"{path} @@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"


def _locate_hunk(hunk: Any, post: list[str]) -> int | None:
    """Where the hunk's post-fix side (context and added lines) starts in the installed file: at
    the line it names, else the one place it occurs (a diff made against a slightly older tree)."""
    target = [line.value.rstrip("\n") for line in hunk if not line.is_removed]
    if not target:
        return None
    n = len(target)
    stated = hunk.target_start - 1
    if post[stated : stated + n] == target:
        return stated
    hits = [i for i in range(len(post) - n + 1) if post[i : i + n] == target]
    return hits[0] if len(hits) == 1 else None


def _changes(hunk: Any, start: int, name: str) -> list[Change]:
    """The runs of removed/added lines of a hunk, placed in the installed file."""
    out: list[Change] = []
    at = start
    current: Change | None = None
    for line in hunk:
        value = line.value.rstrip("\n")
        if line.is_context:
            current = None
            at += 1
            continue
        if current is None:
            current = Change(at=at, post=[], pre=[], hunk=name)
            out.append(current)
        if line.is_added:
            current.post.append(value)
            at += 1
        elif line.is_removed:
            current.pre.append(value)
    return out


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
    st = _FileState(path=path, post=post, tree=tree, notes=notes)
    st.functions, st.top = _functions(tree), _defined_names(tree)
    placed = _place_hunks(pf, path=path, post=post, notes=notes)
    st.post_code = _code("\n".join(post) + "\n")
    every = [c for _, changes in placed for c in changes]
    if len(placed) == len(pf) and every and _same_code(st.post_code, _undo(post, every)):
        notes.append(Note(path, "changes only comments or docstrings: nothing of it to revert", False))
        return [], True
    for name, changes in placed:
        for change in changes:
            _sort_change(st, name, change)
    reverts = _function_reverts(st, module=module)
    _note_new_defs(st)
    return reverts, False


def _place_hunks(pf: Any, *, path: str, post: list[str], notes: list[Note]) -> list[tuple[str, list[Change]]]:
    """Each hunk's changes placed in the installed file; a hunk whose post-fix lines are not
    there is a note that refuses the diff."""
    placed = []
    for hunk in pf:
        name = _hunk_name(path, hunk)
        start = _locate_hunk(hunk, post)
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
        placed.append((name, _changes(hunk, start, name)))
    return placed


def _sort_change(st: _FileState, name: str, change: Change) -> None:
    """One change of the fix: inside a function (reverted with it), a new top-level definition,
    an added import, a comment or docstring (left alone), or something no revert can undo."""
    post, notes = st.post, st.notes
    first = change.at
    last = change.at + max(len(change.post), 1) - 1
    if not change.post:  # a pure deletion sits between two lines: inside a function if both are
        first, last = change.at - 1, change.at
    func = _enclosing(st.functions, first, last)
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
        if _same_code(st.post_code, _undo(st.post, changes)):
            # Its revert would be a part that changes no behaviour: a matrix column of noise.
            st.notes.append(Note(f"{st.path}: {qualname}", "changes only comments or docstrings: not reverted", False))
            continue
        try:
            edits, pre_source = _edits(func, changes, st.post)
        except _NoAnchor as exc:
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


def _code(source: str) -> str | None:
    """The module's code without its comments and docstrings (None when it does not parse):
    two sources with the same one differ in nothing the interpreter runs."""
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
        if isinstance(node, ast.ClassDef) and node.lineno - 1 <= line <= node.end_lineno - 1:
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


class _NoAnchor(Exception):
    pass


def _edits(func: Function, changes: list[Change], post: list[str]) -> tuple[list[EditSpec], str]:
    """The edits that turn ``func``'s post-fix source into its pre-fix one, in order, each
    anchored uniquely in the source as the previous edits left it; and that pre-fix source."""
    lines = post[func.start : func.end + 1]
    base = func.start
    # The pre-fix function as the diff says it was: every change undone, bottom to top.
    pre_lines = list(lines)
    for c in sorted(changes, key=lambda c: c.at, reverse=True):
        i = c.at - base
        pre_lines[i : i + len(c.post)] = c.pre
    current = "\n".join(lines) + "\n"
    edits: list[EditSpec] = []
    # Lines of the post-fix function already taken by an earlier edit's anchor cannot anchor again.
    taken_until = 0
    for c in sorted(changes, key=lambda c: c.at):
        i = c.at - base
        edit = _anchor(lines, i, c, floor=taken_until, current=current)
        if edit is None:
            raise _NoAnchor(
                f"no anchor occurs once in the function for the change at line {c.at + 1} "
                f"({c.hunk}); revert this function by hand"
            )
        spec, after = edit
        current = apply_single_edit(source=current, edit=spec)
        edits.append(spec)
        taken_until = i + len(c.post) + after
    return edits, "\n".join(pre_lines) + "\n"


def _anchor(lines: list[str], i: int, c: Change, *, floor: int, current: str) -> tuple[EditSpec, int] | None:
    """The edit for change ``c`` with the smallest (before, after) context widening that makes
    ``match`` occur exactly once in ``current`` and keeps the replacement's indentation base that
    of the match, and how many lines after the change its anchor took."""
    cur_lines = current.splitlines()
    n = len(c.post)
    for total in range(12):
        for before in range(total, -1, -1):
            after = total - before
            lo, hi = i - before, i + n + after
            if lo < floor or hi > len(lines):
                continue
            match = lines[lo:hi]
            # A lone bracket or blank is no anchor a reader (or a later release) can keep: a
            # match holds at least one line with a name or a number in it.
            if not any(re.search(r"\w", s) for s in match):
                continue
            # Blank context adds nothing (the editor strips the ends); skip widenings that only add them.
            if (before and not lines[lo].strip()) or (after and not lines[hi - 1].strip()):
                continue
            replacement = lines[lo:i] + c.pre + lines[i + n : hi]
            if not _same_base(match, replacement):
                continue
            if (
                len(find_match_positions(source_lines=cur_lines, match_lines="\n".join(match).strip().splitlines()))
                != 1
            ):
                continue
            return EditSpec(match=_block(match), replacement=_block(replacement)), after
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _same_base(match: list[str], replacement: list[str]) -> bool:
    """The editor puts the replacement's first non-blank line at the match's first line's indent
    and keeps every other line's indent relative to it, but cannot place a line to the left of
    that first one: an anchor starting inside brackets (a call's last argument) would move the
    lines after it. Both must start on their least indented line, at the same indent."""
    m = [_indent(s) for s in match if s.strip()]
    r = [_indent(s) for s in replacement if s.strip()]
    if not m or m[0] != min(m) or (r and r[0] != min(r)):
        return False
    return not r or r[0] == m[0]


def _block(lines: list[str]) -> str:
    """Lines as a YAML block: dedented by the first non-blank line's indent, newline-terminated."""
    non_blank = [s for s in lines if s.strip()]
    if not non_blank:
        return ""
    cut = _indent(non_blank[0])
    out = []
    for s in lines:
        out.append(s[min(cut, _indent(s)) :] if s.strip() else "")
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- check and write


def normalized(source: str) -> list[str]:
    """Source compared line by line without trailing blanks and blank lines (the editor drops a
    replacement's leading and trailing blank lines)."""
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def check(p: Plan, *, package: str, source_root: Path) -> list[str]:
    """Each function revert applied to the installed source with the patcher's own editor, as a
    toggle applies it: the problems (none when every reverted function equals the pre-fix
    function of the diff and parses)."""
    import textwrap

    from sglfix.common.errors import SglfixError
    from sglfix.patching.editor import apply_edits
    from sglfix.toggling.doctor import _locate_in

    problems = []
    for r in p.reverts:
        rel = r.target[len(package) + 1 :].split(".")
        try:
            _, source, _ = _locate_in(source_root, rel, r.target)
            result = apply_edits(source=source, edits=r.edits)
        except SglfixError as exc:
            problems.append(str(exc).splitlines()[0])
            continue
        if normalized(result) != normalized(r.pre_source):
            problems.append(f"{r.target}: the revert does not give the pre-fix function of the diff")
            continue
        try:
            ast.parse(textwrap.dedent(result))
        except SyntaxError as exc:
            problems.append(f"{r.target}: the reverted function does not parse ({exc.msg})")
    return problems


def _part_name(qualname: str, taken: set[str]) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", qualname.split(".")[-1].lower()).strip("-") or "part"
    if not name[0].isalpha():
        name = "f-" + name
    out, n = name, 2
    while out in taken:
        out, n = f"{name}-{n}", n + 1
    taken.add(out)
    return out


def groups(p: Plan) -> list[list[FunctionRevert]]:
    """Functions the fix changes the same way (the same edits, like a capture and a replay
    path) form one part; every other function is a part of its own."""
    out: list[list[FunctionRevert]] = []
    for r in p.reverts:
        key = [(e.match, e.replacement) for e in r.edits]
        for g in out:
            if [(e.match, e.replacement) for e in g[0].edits] == key:
                g.append(r)
                break
        else:
            out.append([r])
    return out


def toggle_data(p: Plan) -> dict:
    """The toggle file's content: metadata from the patch header, one part per function group
    (a single ``patches`` list when there is one group)."""

    def patches(group: list[FunctionRevert]) -> list[dict]:
        return [
            {"target": r.target, "edits": [{"match": e.match, "replacement": e.replacement} for e in r.edits]}
            for r in group
        ]

    data: dict[str, Any] = {"pr": p.pr, "title": p.header.title or f"PR {p.pr}"}
    if p.header.url:
        data["url"] = p.header.url
    if p.header.description:
        data["description"] = p.header.description + "\n"
    gs = groups(p)
    if len(gs) == 1:
        data["patches"] = patches(gs[0])
    else:
        taken: set[str] = set()
        data["parts"] = {
            _part_name(g[0].qualname, taken): {
                "summary": "reverts " + ", ".join(r.qualname for r in g),
                "patches": patches(g),
            }
            for g in gs
        }
    return data


def to_yaml(data: dict) -> str:
    """YAML as a person would write the toggle: text blocks in ``|`` style, keys in order."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100)
