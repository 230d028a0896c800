"""A fix's unified diff turned into a revert toggle: each hunk mapped to the function it changes in
the code base's installed (post-fix) source, each change a ``match`` (the post-fix lines, widened
to the smallest anchor that occurs once in the function) and a ``replacement`` (the pre-fix
lines). ``plan()`` does the mapping on the host and refuses what cannot be a function revert;
``check()`` applies the result to the installed source and compares every reverted function with
the pre-fix function the diff describes, before anything is written.

The work is split by step: ``diffread`` reads the diff, ``diffplan`` maps its hunks to function
reverts (and refusals) with the edits ``diffedits`` anchors; this module checks the plan and
writes the toggle, and is where readers take every name from.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from sglfix.toggling.diffedits import Function
from sglfix.toggling.diffplan import FunctionRevert, Note, Plan, plan
from sglfix.toggling.diffread import MAX_DIFF_BYTES, Change, PatchHeader, commit_header, parse_diff

__all__ = [
    "MAX_DIFF_BYTES",
    "Change",
    "Function",
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
    from sglfix.toggling.doctor import locate_in

    problems = []
    for r in p.reverts:
        rel = r.target[len(package) + 1 :].split(".")
        try:
            _, source, _ = locate_in(source_root, rel, r.target)
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
