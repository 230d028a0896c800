"""Every environment variable's name is spelled in one module, sglfix.common.environ: this file
imports nothing of it, so that the check also runs (and fails) on a tree without it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sglfix

# The package imported (so that the check can be shown to fail on a tree without environ.py).
SGLFIX = Path(sglfix.__file__).resolve().parent
HOME = SGLFIX / "common" / "environ.py"
# A variable's name: sglfix's own, and the switch sglang reads too.
NAME = re.compile(r"\b(?:SGLFIX_[A-Z0-9_]+|SGLANG_DEBUG_REVERT_PR)\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: prose, like comments, that may name a variable."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def names_spelled_outside_home(root: Path) -> list[str]:
    """``path:line: NAME`` for each variable name written in a string of code (an f-string's
    text included) or as a keyword (``env.update(NAME=...)``) anywhere under ``root`` but in
    environ.py."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.resolve() == HOME.resolve():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                for name in NAME.findall(node.value):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {name}")
            elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.arg}")
    return found


def test_every_variable_name_is_spelled_in_environ_alone():
    # Imports nothing of the names' home: the check runs on any tree, one without it too.
    spelled = names_spelled_outside_home(SGLFIX)
    assert not spelled, "name these through sglfix.common.environ (envs.X.get(), envs.X.name):\n" + "\n".join(spelled)


def test_the_check_finds_a_name_spelled_in_code_but_not_in_prose(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        '"""Reads SGLFIX_PROFILE."""\n'
        "import os\n"
        "# SGLFIX_DEBUG in a comment\n"
        "def f(name):\n"
        '    """And SGLANG_DEBUG_REVERT_PR."""\n'
        '    return os.environ.get("SGLFIX_PROFILE"), f"SGLANG_DEBUG_REVERT_PR={name}", dict(SGLFIX_APPLY=name)\n'
    )
    assert sorted(names_spelled_outside_home(pkg)) == [
        "pkg/m.py:6: SGLANG_DEBUG_REVERT_PR",
        "pkg/m.py:6: SGLFIX_APPLY",
        "pkg/m.py:6: SGLFIX_PROFILE",
    ]
