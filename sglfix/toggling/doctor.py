"""Drift check: do the registered reverts still apply to the code as it is now?

Live mode imports the targets, applies and restores each toggle and each part, and verifies
every function got its original code object back. Static mode reads source files only (for
trees too heavy to import, such as an unpacked engine wheel), with the same matching rule and
the same messages.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sglfix.common.environ import envs
from sglfix.common.errors import SglfixError
from sglfix.common.schema import nearest
from sglfix.common.yamlio import read_text_file
from sglfix.patching.editor import SourceOrigin, apply_edits
from sglfix.patching.patcher import install_prepared, prepare_specs, restore_all
from sglfix.patching.types import PatchSpec
from sglfix.toggling.registry import Registry, Selection, Toggle

if TYPE_CHECKING:
    from sglfix.codebases import CodeBase

__all__ = [
    "CheckResult",
    "check_source_layout",
    "live_check",
    "locate_in",
    "locate_source",
    "static_apply",
    "static_check",
]


@dataclass
class CheckResult:
    id: str
    ok: bool
    error: str = ""
    targets: list[str] = field(default_factory=list)
    absent: str = ""  # why no revert exists at the version checked (the release predates the fix)

    def to_json(self) -> dict:
        return asdict(self)


def _units(toggle: Toggle) -> list[tuple[str, list[Selection]]]:
    """The whole toggle, then each part alone (a single-part toggle is checked once)."""
    whole = [Selection(toggle, p) for p in toggle.parts.values()]
    units = [(toggle.id, whole)]
    if len(toggle.parts) > 1:
        units += [(s.id, [s]) for s in whole]
    return units


def expectation_check(registry: Registry, scenario_names: list[str]) -> list[CheckResult]:
    """An expectation whose scenario glob matches no scenario checks nothing: report it."""
    import fnmatch

    results: list[CheckResult] = []
    for toggle in registry:
        dead = [
            f"{toggle.path}:{e.line}: expect names no scenario: {e.scenario!r}"
            for e in toggle.expect
            if not any(fnmatch.fnmatchcase(n, e.scenario) for n in scenario_names)
        ]
        if toggle.expect:
            results.append(CheckResult(f"{toggle.id} expect", not dead, "\n".join(dead), []))
    return results


def _check_units(registry: Registry, check: Callable[[list[PatchSpec]], str]) -> list[CheckResult]:
    """Run ``check`` (a message on failure, '' when sound) on each toggle and each part alone."""
    results: list[CheckResult] = []
    for toggle in registry:
        for unit_id, selections in _units(toggle):
            absent = [s for s in selections if s.part.absent]
            if absent:
                # No revert exists at this version (the release predates the fix): nothing to check.
                results.append(CheckResult(unit_id, True, "", [], absent=absent[0].part.absent or ""))
                continue
            specs = [p for s in selections for p in s.part.patches]
            targets = list(dict.fromkeys(p.target for p in specs))
            try:
                problem = check(specs)
            except SglfixError as exc:
                problem = str(exc) or type(exc).__name__
            results.append(CheckResult(unit_id, not problem, problem, targets))
    return results


def live_check(registry: Registry, *, allowed_prefixes: Iterable[str] | None = None) -> list[CheckResult]:
    def apply_and_restore(specs: list[PatchSpec]) -> str:
        prepared = prepare_specs(specs, allowed_prefixes=allowed_prefixes)
        before = {id(p.resolved.function): (p.resolved.function, p.resolved.function.__code__) for p in prepared}
        restore_all(install_prepared(prepared))
        bad = [fn.__qualname__ for fn, code in before.values() if fn.__code__ is not code]
        return f"restore left {', '.join(bad)} changed" if bad else ""

    return _check_units(registry, apply_and_restore)


def locate_source(target: str, source_dir: Path) -> tuple[str, str, int]:
    """(file, function source as inspect.getsource would give it, first line) without importing."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        base = source_dir.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                try:
                    return _find_in_file(candidate, parts[cut:], target)
                except SglfixError:
                    missing = _missing_module(parts, source_dir) if candidate.name == "__init__.py" else None
                    if missing is None:
                        raise
                    raise SglfixError(f"{target}: no module {missing} in {source_dir}") from None
    raise SglfixError(f"{target}: no module file for any prefix of it under {source_dir}")


def _missing_module(parts: list[str], source_dir: Path) -> str | None:
    """The first dotted prefix of ``parts`` that is neither a folder nor a module file (a module
    the release does not have yet), when one comes before the last name."""
    for cut in range(1, len(parts)):
        base = source_dir.joinpath(*parts[:cut])
        if not base.is_dir() and not base.with_suffix(".py").is_file():
            return ".".join(parts[:cut])
        if base.with_suffix(".py").is_file():
            return None
    return None


_PARSED: dict[tuple[str, float], tuple[str, list]] = {}  # a file is read and parsed once per change


def _find_in_file(path: Path, chain: list[str], target: str) -> tuple[str, str, int]:
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        key = (str(path), -1.0)
    if key in _PARSED:
        text, cached = _PARSED[key]
        return _find_in_tree(path, text, cached, chain, target)
    text = read_text_file(path, what="source file")
    try:
        body: list[ast.stmt] = ast.parse(text, filename=str(path)).body
    except SyntaxError as exc:  # this toggle's check fails, naming the file; the others still run
        raise SglfixError(
            f"{target}: {path}:{exc.lineno or '?'}: not valid Python ({exc.msg}); is --source the "
            f"root of the right release?"
        ) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SglfixError(
            f"{target}: {path} cannot be parsed ({type(exc).__name__}: nested too deeply or "
            f"malformed); is --source the root of the right release?"
        ) from None
    _PARSED[key] = (text, body)
    return _find_in_tree(path, text, body, chain, target)


def _find_in_tree(path: Path, text: str, body: list, chain: list[str], target: str) -> tuple[str, str, int]:
    node: ast.AST | None = None
    for name in chain:
        defs = [
            n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ]
        if not defs:
            names = [n.name for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            raise SglfixError(f"{target}: {path} has no definition {name!r} there{nearest(name, names)}")
        node = defs[-1]  # the last definition wins, as at import time
        body = getattr(node, "body", [])
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise SglfixError(f"{target}: {path} defines it as a class, not a function")
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines(keepends=True)[first - 1 : node.end_lineno]
    return str(path), "".join(lines), first


def static_apply(specs: list[PatchSpec], source_dir: Path) -> None:
    """Apply ``specs`` to the source files under ``source_dir`` without importing them, in order
    (a second spec on a function edits the first one's result): a SglfixError naming the target
    of the first that does not match or leaves no single def that parses."""
    current: dict[str, tuple[str, str, int]] = {}
    for spec in specs:
        filename, source, first = current.get(spec.target) or locate_source(spec.target, source_dir)
        origin = SourceOrigin(target=spec.target, filename=filename, first_lineno=first)
        edited = apply_edits(source=source, edits=spec.edits, origin=origin)
        try:
            tree = ast.parse(textwrap.dedent(edited))
        except SyntaxError as exc:
            raise SglfixError(
                f"{spec.target}: the edited source does not parse ({exc.msg}); check the replacement's indentation"
            ) from None
        if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise SglfixError(f"{spec.target}: after the edits the source is no longer a single def")
        current[spec.target] = (filename, textwrap.dedent(edited), first)


def precheck_selections(selections: Iterable, *, package: str, allowed_prefixes: Iterable[str] | None) -> None:
    """Every patch of ``selections`` against the installed source of ``package`` (the code base),
    without importing it: its target allowed, its function found, its edits matching and the
    edited function parsing. The first problem is one SglfixError naming the part: what a worker
    would meet at its first cell, found before any worker starts."""
    from sglfix.common.codebase import package_dir
    from sglfix.patching.targets import check_allowed

    found = package_dir(package)  # imports at most the parents of package, never it
    if found is None:
        return  # no installed source to read: the workers report what they meet
    root = Path(found)
    current: dict[str, tuple[str, str, int]] = {}
    for sel in selections:
        for patch in sel.part.patches:
            label = f"{getattr(sel, 'verb', 'revert')} {sel.id}"
            try:
                check_allowed(patch.target, allowed_prefixes)
            except SglfixError as exc:
                raise SglfixError(f"{label}: {str(exc).splitlines()[0]}") from None
            if not patch.target.startswith(package + "."):
                continue  # outside the code base (an allowed extra prefix): the worker checks it
            rel = patch.target[len(package) + 1 :].split(".")
            try:
                if patch.target not in current:
                    current[patch.target] = locate_in(root, rel, patch.target)
                filename, source, first = current[patch.target]
                edited = apply_edits(
                    source=source,
                    edits=patch.edits,
                    origin=SourceOrigin(target=patch.target, filename=filename, first_lineno=first),
                )
                try:
                    ast.parse(textwrap.dedent(edited))
                except SyntaxError as exc:
                    raise SglfixError(
                        f"{patch.target}: the edited source does not parse ({exc.msg}); check the replacement"
                    ) from None
                current[patch.target] = (filename, edited, first)
            except SglfixError as exc:
                raise SglfixError(f"{label}: {str(exc).splitlines()[0]}") from None


def locate_in(root: Path, rel: list[str], target: str) -> tuple[str, str, int]:
    """(file, function source, first line) of ``target`` read under ``root``, its package's
    folder, without importing it; ``rel``: the target's dotted path below the package, split."""
    for cut in range(len(rel) - 1, 0, -1):
        base = root.joinpath(*rel[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return _find_in_file(candidate, rel[cut:], target)
    init = root / "__init__.py"
    if init.is_file():
        return _find_in_file(init, rel, target)
    raise SglfixError(f"{target}: no module file for it under {root}")


def _package_of(target: str) -> tuple[str, CodeBase | None]:
    """The package a target's module lives in as a source tree lays it out, and its code base: a
    known code base's (sglfix.backends, sglang) when the target is under one, else its top-level
    name and None."""
    from sglfix.codebases import CODEBASES

    for cb in CODEBASES.values():
        if target == cb.package or target.startswith(cb.package + "."):
            return cb.package, cb
    return target.split(".")[0], None


def check_source_layout(registry: Registry, source_dir: str | Path) -> None:
    """Refuse a --source DIR that lacks a package the toggles target: with the wrong folder (the
    package itself, a checkout's root above python/) every toggle would read as drifted, when
    nothing was compared."""
    from sglfix.common.errors import ConfigError

    root = Path(source_dir)
    targets = [p.target for t in registry for part in t.parts.values() for p in part.patches]
    for pkg, cb in dict(_package_of(t) for t in targets).items():
        parts = pkg.split(".")
        if root.joinpath(*parts).is_dir() or root.joinpath(*parts).with_suffix(".py").is_file():
            continue
        folder = "/".join(parts) + "/"
        fix = f"give the directory that holds {folder} (an unpacked wheel's root"
        here = root.resolve()
        if list(here.parts[-len(parts) :]) == parts and (root / "__init__.py").is_file():
            fix = f"give {here.parents[len(parts) - 1]}, the folder that holds it"  # DIR is the package itself
        # Where a checkout of the code base keeps the package, as a fix's diff names its files.
        elif cb is not None and cb.repo_prefix.endswith(folder):
            sub = cb.repo_prefix[: -len(folder)]
            fix += f", or a checkout's {sub or 'root'})"
            if sub and root.joinpath(sub, *parts).is_dir():
                fix = f"give {root / sub.rstrip('/')}, which holds it"
        else:
            fix += ")"
        raise ConfigError(
            f"--source {source_dir} has no {folder} folder (the toggles' targets are modules of {pkg}); {fix}"
        )


def static_check(registry: Registry, *, source_dir: str | Path) -> list[CheckResult]:
    root = Path(source_dir)
    if not root.is_dir():
        raise SglfixError(f"--source {source_dir} is not a directory; give the root that holds the packages")
    check_source_layout(registry, root)

    def apply_to_source(specs: list[PatchSpec]) -> str:
        static_apply(specs, root)
        return ""

    return _check_units(registry, apply_to_source)


PYTEST_HINT = "pip install 'sglfix[test]' (or pip install pytest)"


def pytest_missing() -> str | None:
    """Why this Python cannot import pytest (None when it can): ``--caught-by`` runs the tests
    with it, and without it every claim would fail the same way, after the other checks."""
    try:
        import pytest  # noqa: F401
    except ImportError as exc:  # a module that is absent, or one whose own imports fail
        return str(exc) or type(exc).__name__
    return None


def caught_by_check(registry: Registry, *, root: str | Path, timeout: float = 3600) -> list[CheckResult]:
    """Each toggle's ``caught_by`` tests fail with the toggle reverted: the pytest plugin's
    ``--sglfix-check-fixes`` run on exactly those tests, the toggle as each one's claim."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    root = Path(root)
    claims: dict[str, list[str]] = {}
    results: list[CheckResult] = []
    missing: dict[str, list[str]] = {}
    for toggle in registry:
        for node in toggle.caught_by:
            if not (root / node.split("::")[0]).is_file():
                missing.setdefault(toggle.id, []).append(node)
                continue
            claims.setdefault(node, []).append(toggle.id)
    if not claims and not missing:
        return []
    outcomes: dict[str, list[dict]] = {}
    if claims:
        with tempfile.TemporaryDirectory(prefix="sglfix-caught-by-") as tmp:
            report = os.path.join(tmp, "report.json")
            env = {k: v for k, v in os.environ.items() if k not in (envs.REVERT_PR.name, "PYTEST_ADDOPTS")}
            envs.SGLFIX_CHECK_CLAIMS.set(json.dumps(claims), env=env)
            envs.SGLFIX_CHECK_REPORT.set(report, env=env)
            envs.SGLFIX_TOGGLES_DIR.set(registry.directory, env=env)
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sglfix-check-fixes", *claims],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if not os.path.exists(report):
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
                # Run from the tests' root, pytest may still fail to import where the CLI did not.
                last = tail[-1] if tail else ""
                hint = f"; install it: {PYTEST_HINT}" if "No module named" in last and "pytest" in last else ""
                raise SglfixError(
                    f"--caught-by: pytest did not run the checks (exit {proc.returncode}): " + " | ".join(tail) + hint
                )
            with open(report, encoding="utf-8") as fh:
                outcomes = json.load(fh)
    for toggle in registry:
        problems = [f"{node}: names no test file under {root}" for node in missing.get(toggle.id, [])]
        nodes = [n for n in toggle.caught_by if n in claims]
        for node in nodes:
            ran = [
                (nid, o)
                for nid, found in outcomes.items()
                if nid == node or nid.split("[")[0] == node
                for o in found
                if o["id"] == toggle.id
            ]
            if not ran:
                problems.append(f"{node}: no such test ran")
            for nid, o in ran:
                if o["outcome"] != "caught":
                    # The claim's outcome as the one rule names it (sglfix.report.outcome.Claim).
                    label = {"inconclusive": "inconclusive", "not-run": "not run", "error": "ERROR"}
                    problems.append(f"{nid}: {label.get(o['outcome'], 'NOT caught')} ({o['detail']})")
        if toggle.caught_by:
            results.append(
                CheckResult(f"{toggle.id} caught_by", not problems, "\n".join(problems), list(toggle.caught_by))
            )
    return results
