"""The layout: backends mirror upstream module paths, the judge stays outside them, the parent
stays light, and the arrows between sub-packages run one way."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from builders import ROOT

sys.path.insert(0, str(Path(__file__).parent))

# Toggle-target modules that exist only in the reproduction, each with the reason (none today:
# every target module, the scenario kit's included, has its upstream counterpart).
REPRODUCTION_ONLY: dict[str, str] = {}


def _targets() -> set[str]:
    from sglfix.toggling.registry import load_registry

    return {p.target for t in load_registry() for part in t.parts.values() for p in part.patches}


def _module_of(target: str) -> str:
    import importlib

    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
            return name
        except ImportError:
            continue
    raise AssertionError(target)


@pytest.mark.network
def test_toggle_target_modules_exist_in_sglang_0_5_23():
    import sglang_wheel as sw

    wheel = sw.fetch_wheel("0.5.23")
    names = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    missing = []
    for target in sorted(_targets()):
        module = _module_of(target)
        assert module.startswith("sglfix.backends."), target
        if module in REPRODUCTION_ONLY:
            continue
        upstream = "sglang/" + module[len("sglfix.backends.") :].replace(".", "/") + ".py"
        if upstream not in names:
            missing.append(f"{target}: no {upstream} in sglang 0.5.23")
    assert not missing, "\n".join(missing)


def test_judge_is_not_under_backends_and_backends_never_import_the_tool():
    for path in (ROOT / "backends").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                name = node.module
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if name.startswith("sglfix") and not name.startswith("sglfix.backends"):
                pytest.fail(f"{path.relative_to(ROOT)} imports {name}: the code under test must not use the tool")


# Allowed arrows between sub-packages (importer -> importees); common is a leaf for everyone.
ARROWS = {
    "cli": {
        "execution",
        "harness",
        "report",
        "scenario",
        "toggling",
        "patching",
        "codebases",
        "mutation",
        "search",
        "common",
    },
    # The runner reads a saved report's cell timings (--shard-costs) and bisect judges its cells
    # through the one judgement (sglfix.report.outcome); report itself stands on common alone.
    "execution": {"harness", "scenario", "toggling", "codebases", "report", "mutation", "search", "common"},
    # The search space is drawn from the scenario schema and the code base's record, the shrinker
    # works on scenario nodes: nothing runs a cell there (execution runs them).
    "search": {"scenario", "codebases", "common"},
    # Mutants are made from source text and checked by the toggles' own engine (a mutant is a
    # candidate fix): nothing of the code under test is imported.
    "mutation": {"toggling", "patching", "codebases", "common"},
    # The harness may patch an engine around a construction (lifting a gate, as upstream's repro
    # scripts do) with the patch engine, a leaf that depends on nothing else of sglfix.
    "harness": {"scenario", "codebases", "patching", "common", "backends"},
    "report": {"common"},
    "toggling": {"patching", "codebases", "common"},
    "codebases": {"common"},
    "patching": {"common"},
    "scenario": {"common"},
    "common": set(),
}
# The package's top (sglfix/__init__.py) stands above every sub-package: only itself and what
# stands above it (these, under sglfix/) may take names from it. The top imports sub-packages,
# so an arrow up to it from below is also a way round a circle.
ABOVE_THE_TOP = {"__init__.py", "__main__.py", "cli"}
PACKAGE = ROOT / "sglfix"


def _module_file(name: str) -> Path | None:
    """The file that module ``name`` of sglfix is, or None when ``name`` is no module (a name
    defined in a module). Run from the checkout, sglfix.backends and the data packages sit next
    to the package (``sglfix._source_checkout_layout``)."""
    parts = name.split(".")
    if parts[0] != "sglfix":
        return None
    for base in (PACKAGE, ROOT):
        if base == ROOT and len(parts) == 1:
            continue
        path = base.joinpath(*parts[1:])
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
        if len(parts) > 1 and path.with_name(path.name + ".py").is_file():
            return path.with_name(path.name + ".py")
    return None


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every module of sglfix that ``path`` imports, wherever the import
    stands (in a function, under TYPE_CHECKING): each names the module whose code it runs,
    ``from a import b`` the submodule ``a.b`` where there is one."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    package = ["sglfix", *rel[:-1]]  # where a relative import starts, in a package's __init__ too
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "sglfix"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base.split(".")[0] != "sglfix":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if _module_file(sub) else base))
    return out


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _import_graph() -> dict[Path, dict[Path, int]]:
    """file -> {file it imports: the line of the first such import}, over the files of sglfix/."""
    graph: dict[Path, dict[Path, int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        arrows = graph.setdefault(path, {})
        for line, name in _imported(path):
            target = _module_file(name)
            if target is not None and target != path and target.is_relative_to(PACKAGE):
                arrows.setdefault(target, line)
    return graph


def _circles(graph: dict[Path, dict[Path, int]]) -> list[list[Path]]:
    """The strongly connected groups of more than one file (Tarjan's algorithm, iterative)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_circles_between_files():
    graph = _import_graph()
    shown = []
    for group in _circles(graph):
        members = set(group)
        arrows = [
            f"  {_shown(a)}:{graph[a][b]} -> {_shown(b)}" for a in group for b in sorted(graph[a]) if b in members
        ]
        shown.append(f"circle of {len(group)} files: {', '.join(map(_shown, group))}\n" + "\n".join(arrows))
    assert not shown, "\n".join(shown)


def test_imports_run_one_way():
    """Between sub-packages along ARROWS, and never up to the package's top from below it."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        pkg = rel.parts[0] if len(rel.parts) > 1 else None
        if pkg is not None and pkg not in ARROWS:
            bad.append(f"sglfix/{pkg} has no place in ARROWS")
            continue
        above = rel.parts[0] in ABOVE_THE_TOP
        for line, name in _imported(path):
            if name == "sglfix":
                if not above:
                    bad.append(f"{_shown(path)}:{line} imports from sglfix/__init__.py, the package's top")
                continue
            other = name.split(".")[1]
            if pkg is not None and other != pkg and other not in ARROWS[pkg]:
                bad.append(f"{_shown(path)}:{line} imports {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every ``_private`` name (a dunder is not one) that ``path`` takes from
    another module of sglfix: imported by name (``from sglfix.a import _x``, relative imports
    too), or read off a module or object imported from one (``a._x`` after ``from sglfix import
    a``; a name the module also assigns is left alone, it may be a local of that name)."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    package = ["sglfix", *rel[:-1]]
    tree = ast.parse(path.read_text())
    found: list[tuple[int, str]] = []
    bound: dict[str, str] = {}  # a name this module binds by importing -> what it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sglfix" and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base.split(".")[0] != "sglfix" or _module_file(base) == path:
                continue
            for alias in node.names:
                if _is_private(alias.name):
                    found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
                elif _module_file(f"{base}.{alias.name}") != path:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    assigned |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = ast.unparse(node.value)
            if owner in bound and owner not in assigned:
                found.append((node.lineno, f"{owner}.{node.attr} ({bound[owner]}.{node.attr})"))
            elif owner.startswith("sglfix.") and _module_file(owner) not in (None, path):
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(found)


def test_no_module_takes_a_private_name_from_another():
    """A ``_private`` name is its module's own: a piece another module needs is that module's
    interface (a public name saying what it promises), or it goes back to its one user."""
    bad = [
        f"{_shown(path)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, what in _private_names(path)
    ]
    assert not bad, f"{len(bad)} private name(s) taken across modules:\n" + "\n".join(bad)


# Floors inside the harness, top first: the cell runner runs the adapters, which build their
# cases with the scenario kits. A module imports nothing of a floor above its own.
HARNESS_FLOORS = ("harness/cell.py", "harness/adapters", "harness/kits")
# Leaves of the harness: names every floor takes, kept where no floor's imports can follow.
HARNESS_LEAVES = {
    "harness/unavailable.py": {"NoOutput", "Unavailable"},
    "harness/codefault.py": {"BrokenContract", "CodeFault", "OutOfBounds"},
}


def _floor(path: Path) -> int | None:
    rel = path.relative_to(PACKAGE).as_posix()
    return next((i for i, f in enumerate(HARNESS_FLOORS) if rel == f or rel.startswith(f + "/")), None)


def test_the_harness_imports_no_floor_above_and_its_leaves_stay_leaves():
    bad = []
    for path in sorted((PACKAGE / "harness").rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        mine = _floor(path)
        for line, name in _imported(path):
            target = _module_file(name)
            if target is None or not target.is_relative_to(PACKAGE) or target == path:
                continue
            if rel in HARNESS_LEAVES:
                bad.append(f"{_shown(path)}:{line} imports {name}: a leaf imports nothing of sglfix")
            above = _floor(target)
            if mine is not None and above is not None and above < mine:
                bad.append(f"{_shown(path)}:{line} imports {name}, a floor above its own ({HARNESS_FLOORS[above]})")
    # Each leaf's names are defined there alone (not again on a floor, where a circle would wait).
    homes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(path.relative_to(PACKAGE).as_posix())
    for leaf, names in HARNESS_LEAVES.items():
        for name in sorted(names):
            if homes.get(name) != [leaf]:
                bad.append(
                    f"{name} is defined in {', '.join(homes.get(name) or ['no module'])}, not in sglfix/{leaf} alone"
                )
    assert not bad, "\n".join(bad)


def test_cli_commands_do_not_import_torch_in_the_parent():
    code = (
        "import sys\nfrom sglfix.cli import main\n"
        "for argv in (['list'], ['scenarios'], ['env'], ['doctor', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'triton', 'sglfix.backends') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_test_folders_mirror_the_package():
    """A test of ``sglfix/execution/store`` lives in ``tests/execution/store``: each folder of tests
    is a package of sglfix (``backends`` is the reproduction, installed as ``sglfix.backends``)."""
    tests = ROOT / "tests"
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if rel.parts[0] in ("fixtures", "backends") or "__pycache__" in rel.parts:
            continue
        assert (ROOT / "sglfix" / rel / "__init__.py").is_file(), f"tests/{rel.as_posix()} mirrors no package of sglfix"
        assert any(folder.glob("test_*.py")), f"tests/{rel.as_posix()} holds no test file"
