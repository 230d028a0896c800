"""Harness for comparing sglfix's patch engine with sglang's own, on sglang's real YAMLs.

Nothing of sglang is committed to this repository. At test time:

1. ``fetch_wheel()`` downloads the sglang wheel from the package index (``pip download``)
   into a cache directory (``$SGLFIX_CACHE`` or ``~/.cache/sglfix/wheels``), reused when the
   file is already there.
2. ``extract_wheel()`` unpacks only what the comparison needs into a scratch directory:
   ``pr_fix_toggle.py`` (the registry of revert YAMLs, parsed with ``ast``, never executed),
   sglang's ``source_patcher`` package (its patch engine) and the module files that the
   YAMLs' ``target:`` lines name, with the ``__init__.py`` files of their packages.
3. ``FakeSglang`` builds, inside ``sys.modules``, a fake importable ``sglang`` tree: package
   modules with an empty ``__path__``, target modules whose ``__file__`` is the extracted
   real file and which hold only the target functions, each compiled from its own
   ``FunctionDef`` node of the real file (decorators dropped, real filename and line
   numbers, so that ``inspect.getsource`` works), and sglang's real ``source_patcher``
   package under its real name. sglang itself (CUDA libraries and all) is never imported.
   Leaving the context removes every entry it added.

Helpers to run an engine on a YAML and to fingerprint code objects complete the kit.
"""

from __future__ import annotations
import __future__

import ast
import copy
import dis
import glob
import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SGLANG_VERSION = "0.5.23"
TOGGLE_MODULE = "sglang/srt/debug_utils/pr_fix_toggle.py"
PATCHER_PACKAGE = "sglang.srt.debug_utils.source_patcher"
PATCHER_DIR = "sglang/srt/debug_utils/source_patcher/"
# Dependency order of sglang's source_patcher modules (the package __init__ comes last).
PATCHER_MODULES = ("types", "source_editor", "code_patcher")
YAML_PREFIX = "_PR_REVERT_YAML_"


class WheelFetchError(RuntimeError):
    """The wheel could not be downloaded: the test must fail, not skip."""


# --------------------------------------------------------------------------- download


def cache_dir() -> Path:
    env = os.environ.get("SGLFIX_CACHE")
    base = Path(env).expanduser() if env else Path("~/.cache/sglfix").expanduser()
    return base / "wheels"


def _cached(directory: Path, version: str) -> Path | None:
    hits = sorted(glob.glob(str(directory / f"sglang-{version}-*.whl")))
    for hit in hits:
        if zipfile.is_zipfile(hit):
            return Path(hit)
    return None


def fetch_wheel(version: str = SGLANG_VERSION, directory: Path | None = None) -> Path:
    """Path of the sglang wheel, downloaded with ``pip download`` unless already cached."""
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    hit = _cached(directory, version)
    if hit is not None:
        return hit
    base = [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}", "-d", str(directory)]
    attempts = [
        base,
        # The wheel is built for CPython 3.11 on manylinux: ask for it explicitly when the
        # interpreter running the tests is something else (the files we read are pure Python).
        base + ["--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64"],
    ]
    logs: list[str] = []
    for command in attempts:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        logs.append(f"$ {' '.join(command)}\n(exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        hit = _cached(directory, version)
        if proc.returncode == 0 and hit is not None:
            return hit
    raise WheelFetchError(
        f"could not download sglang=={version} from the package index into {directory} "
        f"(set SGLFIX_CACHE to choose the cache directory, or put the wheel there):\n" + "\n".join(logs)
    )


# --------------------------------------------------------------------------- extraction


def parse_revert_yamls(source: str) -> dict[int, str]:
    """Module-level ``_PR_REVERT_YAML_<N> = "..."`` constants, keyed by PR number."""
    out: dict[int, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if (
                isinstance(target, ast.Name)
                and target.id.startswith(YAML_PREFIX)
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
            ):
                out[int(target.id[len(YAML_PREFIX) :])] = value.value
    return out


def yaml_targets(yaml_text: str) -> list[str]:
    return [patch["target"] for patch in yaml.safe_load(yaml_text)["patches"]]


@dataclass(frozen=True)
class TargetLocation:
    target: str  # sglang.srt.speculative.eagle_utils._eagle_prefill_tail_tokens
    module: str  # sglang.srt.speculative.eagle_utils
    member: tuple[str, ...]  # ("_eagle_prefill_tail_tokens",) or ("Class", "method")
    relpath: str  # sglang/srt/speculative/eagle_utils.py
    is_package: bool = False


def locate_target(names: set[str], target: str) -> TargetLocation:
    """Longest prefix of the dotted target that is a ``.py`` file or package in the wheel."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        stem = "/".join(parts[:cut])
        if f"{stem}.py" in names:
            return TargetLocation(target, ".".join(parts[:cut]), tuple(parts[cut:]), f"{stem}.py")
        if f"{stem}/__init__.py" in names:
            return TargetLocation(target, ".".join(parts[:cut]), tuple(parts[cut:]), f"{stem}/__init__.py", True)
    raise LookupError(f"no module of the wheel holds {target!r}")


@dataclass
class ExtractedWheel:
    wheel: Path
    root: Path  # directory holding the extracted sglang/
    yamls: dict[int, str]  # PR number -> revert YAML
    locations: dict[str, TargetLocation]  # target -> where it lives
    _trees: dict[str, ast.Module] = field(default_factory=dict, repr=False)

    def path(self, relpath: str) -> Path:
        return self.root / relpath

    def tree(self, relpath: str) -> ast.Module:
        if relpath not in self._trees:
            self._trees[relpath] = ast.parse(self.path(relpath).read_text(), filename=str(self.path(relpath)))
        return self._trees[relpath]

    def targets(self, pr: int) -> list[str]:
        return yaml_targets(self.yamls[pr])


def _package_inits(relpath: str) -> list[str]:
    parts = relpath.split("/")[:-1]
    return ["/".join(parts[: i + 1]) + "/__init__.py" for i in range(len(parts))]


def extract_wheel(wheel: Path, dest: Path) -> ExtractedWheel:
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        if TOGGLE_MODULE not in names:
            raise LookupError(f"{wheel.name} has no {TOGGLE_MODULE}")
        wanted = {TOGGLE_MODULE}
        wanted |= {n for n in names if n.startswith(PATCHER_DIR) and n.endswith(".py")}
        yamls = parse_revert_yamls(zf.read(TOGGLE_MODULE).decode())
        locations: dict[str, TargetLocation] = {}
        for text in yamls.values():
            for target in yaml_targets(text):
                loc = locate_target(names, target)
                locations[target] = loc
                wanted.add(loc.relpath)
        for relpath in list(wanted):
            wanted |= {init for init in _package_inits(relpath) if init in names}
        for name in sorted(wanted):
            zf.extract(name, dest)
    return ExtractedWheel(wheel=wheel, root=dest, yamls=yamls, locations=locations)


# --------------------------------------------------------------------------- fake tree


class _Placeholder:
    """Stands for a module-level name that a ``def`` statement evaluates (annotations)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<placeholder {self._name}>"

    def __getitem__(self, item: Any) -> _Placeholder:  # Optional[X]-style annotations
        return self

    def __getattr__(self, item: str) -> _Placeholder:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")

    def __or__(self, other: Any) -> _Placeholder:
        return self

    __ror__ = __or__


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__future__, alias.name, None)
                if feature is not None:
                    flags |= feature.compiler_flag
    return flags


def _find_def(tree: ast.Module, member: tuple[str, ...]) -> tuple[list[str], ast.FunctionDef]:
    body: list[ast.stmt] = tree.body
    classes: list[str] = []
    for i, name in enumerate(member):
        last = i == len(member) - 1
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        found = [node for node in body if isinstance(node, kinds) and node.name == name]
        if not found:
            raise LookupError(f"{'.'.join(member)}: no {'def' if last else 'class'} {name!r}")
        node = found[-1]  # the last definition wins, as at runtime
        if last:
            return classes, node  # type: ignore[return-value]
        classes.append(name)
        body = node.body
    raise LookupError(f"empty member path {member!r}")


class FakeSglang:
    """Context manager: a fake ``sglang`` tree in ``sys.modules`` holding the targets."""

    def __init__(self, extracted: ExtractedWheel, targets: Iterable[str] | None = None) -> None:
        self.extracted = extracted
        self.targets = list(targets) if targets is not None else list(extracted.locations)
        self._added: list[str] = []
        self._saved: dict[str, Any] = {}
        self.functions: dict[str, types.FunctionType] = {}
        self.original_code: dict[str, types.CodeType] = {}
        self.patcher: types.ModuleType | None = None

    # ---- sys.modules bookkeeping

    def _install(self, name: str, module: types.ModuleType) -> types.ModuleType:
        if name in sys.modules and name not in self._added:
            self._saved[name] = sys.modules[name]
        sys.modules[name] = module
        if name not in self._added:
            self._added.append(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        return module

    def _package(self, name: str) -> types.ModuleType:
        existing = sys.modules.get(name)
        if existing is not None and name in self._added:
            return existing
        parent = name.rpartition(".")[0]
        if parent:
            self._package(parent)
        module = types.ModuleType(name)
        module.__path__ = []  # a package that can find no submodule on disk
        module.__package__ = name
        init = self.extracted.root / name.replace(".", "/") / "__init__.py"
        if init.exists():
            module.__file__ = str(init)
        return self._install(name, module)

    def _module(self, loc: TargetLocation) -> types.ModuleType:
        existing = sys.modules.get(loc.module)
        if existing is not None and loc.module in self._added and not hasattr(existing, "__path__"):
            return existing
        if loc.is_package:
            return self._package(loc.module)
        parent = loc.module.rpartition(".")[0]
        if parent:
            self._package(parent)
        module = types.ModuleType(loc.module)
        module.__file__ = str(self.extracted.path(loc.relpath))
        module.__package__ = parent
        return self._install(loc.module, module)

    # ---- target functions

    def _define(self, target: str) -> types.FunctionType:
        loc = self.extracted.locations[target]
        module = self._module(loc)
        tree = self.extracted.tree(loc.relpath)
        classes, node = _find_def(tree, loc.member)
        node = copy.deepcopy(node)
        node.decorator_list = []
        code = compile(
            ast.Module(body=[node], type_ignores=[]),
            str(self.extracted.path(loc.relpath)),
            "exec",
            flags=_future_flags(tree),
            dont_inherit=True,
        )
        namespace: dict[str, Any] = {}
        for _ in range(64):
            try:
                exec(code, module.__dict__, namespace)
                break
            except NameError as exc:  # a name evaluated by the def statement itself
                if not exc.name or exc.name in module.__dict__:
                    raise
                module.__dict__[exc.name] = _Placeholder(exc.name)
        else:  # pragma: no cover
            raise RuntimeError(f"{target}: too many unresolved names")
        fn = namespace[node.name]
        fn.__module__ = loc.module
        fn.__qualname__ = ".".join([*classes, node.name])
        holder: Any = module
        for depth, cls_name in enumerate(classes):
            cls = getattr(holder, cls_name, None)
            if not isinstance(cls, type):
                qualname = ".".join(classes[: depth + 1])
                cls = type(cls_name, (), {"__module__": loc.module, "__qualname__": qualname})
                setattr(holder, cls_name, cls)
            holder = cls
        setattr(holder, node.name, fn)
        return fn

    def _load_patcher(self) -> types.ModuleType:
        self._package("sglang.srt.debug_utils")
        directory = self.extracted.root / PATCHER_DIR
        package_spec = importlib.util.spec_from_file_location(
            PATCHER_PACKAGE, directory / "__init__.py", submodule_search_locations=[str(directory)]
        )
        assert package_spec is not None and package_spec.loader is not None
        package = importlib.util.module_from_spec(package_spec)
        self._install(PATCHER_PACKAGE, package)
        for short in PATCHER_MODULES:
            name = f"{PATCHER_PACKAGE}.{short}"
            spec = importlib.util.spec_from_file_location(name, directory / f"{short}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            self._install(name, module)
            spec.loader.exec_module(module)
        package_spec.loader.exec_module(package)
        return package

    # ---- context manager

    def __enter__(self) -> FakeSglang:
        try:
            for target in self.targets:
                fn = self._define(target)
                self.functions[target] = fn
                self.original_code[target] = fn.__code__
            self.patcher = self._load_patcher()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for name in reversed(self._added):
            if name in self._saved:
                sys.modules[name] = self._saved.pop(name)
            else:
                sys.modules.pop(name, None)
        self._added.clear()

    # ---- helpers

    def patched_targets(self) -> list[str]:
        return [t for t, fn in self.functions.items() if fn.__code__ is not self.original_code[t]]


# --------------------------------------------------------------------------- comparison


def fingerprint(code: types.CodeType) -> dict[str, Any]:
    """What a code object does, without its line numbers, offsets or file name.

    ``NOP``s are dropped (the compiler keeps them only to carry a line number) and a jump's
    target is given as the index of the instruction it lands on.
    """
    instructions = [i for i in dis.get_instructions(code) if i.opname not in ("NOP", "CACHE")]
    index_of = {i.offset: n for n, i in enumerate(instructions)}
    all_offsets = sorted(i.offset for i in dis.get_instructions(code))
    jumps = set(dis.hasjrel) | set(dis.hasjabs)

    def landing(offset: int) -> int:
        for candidate in all_offsets:
            if candidate >= offset and candidate in index_of:
                return index_of[candidate]
        return len(instructions)

    ops = []
    for ins in instructions:
        if ins.opcode in jumps and isinstance(ins.argval, int):
            ops.append((ins.opname, f"-> #{landing(ins.argval)}"))
        elif isinstance(ins.argval, types.CodeType):  # its repr holds an address and a line
            ops.append((ins.opname, f"<code {ins.argval.co_name}>"))
        else:
            ops.append((ins.opname, ins.argrepr))
    return {
        "name": code.co_name,
        "argcount": code.co_argcount,
        "posonlyargcount": code.co_posonlyargcount,
        "kwonlyargcount": code.co_kwonlyargcount,
        "flags": code.co_flags,
        "names": code.co_names,
        "varnames": code.co_varnames,
        "freevars": code.co_freevars,
        "cellvars": code.co_cellvars,
        "instructions": tuple(ops),
        "consts": tuple(fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts),
    }


def fingerprint_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Human-readable differences between two fingerprints (first few)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in a.keys() | b.keys():
            out += fingerprint_diff(a.get(key), b.get(key), f"{path}.{key}")
        return out
    if isinstance(a, tuple) and isinstance(b, tuple) and a and isinstance(a[0], (dict, tuple)):
        out = []
        for n, (x, y) in enumerate(zip(a, b)):
            out += fingerprint_diff(x, y, f"{path}[{n}]")
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@dataclass
class Outcome:
    status: str  # "applied" | "refused"
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    error_type: str = ""
    error: str = ""
    exc: BaseException | None = None
    states: list[Any] = field(default_factory=list)
    restored: bool = False  # every __code__ is the original again
    leftover: list[str] = field(default_factory=list)  # targets still patched after a refusal

    def summary(self) -> tuple[str, str]:
        return (self.status, self.error_type)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def run_engine(apply: Callable[[str], list[Any]], yaml_text: str, fake: FakeSglang, targets: Iterable[str]) -> Outcome:
    """Apply a YAML with an engine, fingerprint what it produced, then restore."""
    targets = list(targets)
    try:
        states = apply(yaml_text)
    except Exception as exc:
        outcome = Outcome(
            status="refused",
            error_type=type(exc).__name__,
            error=first_line(exc),
            exc=exc,
            leftover=fake.patched_targets(),
        )
        for target in outcome.leftover:  # a non-atomic engine left these patched: undo
            fake.functions[target].__code__ = fake.original_code[target]
        return outcome
    outcome = Outcome(status="applied", states=list(states))
    for target in targets:
        outcome.fingerprints[target] = fingerprint(fake.functions[target].__code__)
    for state in reversed(outcome.states):
        state.restore()
    outcome.restored = all(fake.functions[t].__code__ is fake.original_code[t] for t in fake.functions)
    return outcome
