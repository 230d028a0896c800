"""The result store: a cell is served again only while nothing it depends on changed.

Each test runs the CLI twice or more against one store folder and reads, cell by cell, which
results the store served (``stored`` in the report) and which ran; the verdicts must be those of a
run without the store. The edits are real: a toggle file of a copied toggles folder, and files of
a linked copy of the installed sglang put first on PYTHONPATH (a source tree, as a checkout is).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli, run_probe

from sglfix.execution.store.fingerprint import skeleton_digest
from sglfix.harness.result import CellResult

ON = {"SGLFIX_STORE": ""}  # the suite turns the store off (conftest); these tests name a folder


def _cells(path: Path) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(path.read_text())["cells"]}


def _matrix(
    *args: str, out: Path, env: dict | None = None, cwd: str | None = None, timeout: float = 600, pre: tuple = ()
):
    r = run_cli(
        *pre, "matrix", *args, "--device", "cpu", "--json", str(out), env={**ON, **(env or {})}, cwd=cwd,
        timeout=timeout, subprocess=True,
    )  # fmt: skip
    assert r.code in (0, 1), (r.code, r.out[-2000:], r.err[-2000:])
    return json.loads(out.read_text())


# -- the skeleton: what an imported, never-entered file is keyed on -------------------------------

BASE = b"""
import triton
LIMIT = 4

@triton.jit
def kernel(x):
    y = x + 1

class Backend:
    size = LIMIT

    def forward(self, q):
        return q * 2
"""


@pytest.mark.parametrize(
    ("old", "new", "same"),
    [
        (b"return q * 2", b"return q * 3  # a body no cell entered", True),
        (b"        return q * 2", b"        # a comment\n        return q * 2", True),
        (b"LIMIT = 4", b"LIMIT = 5", False),  # module level: ran at import
        (b"size = LIMIT", b"size = LIMIT + 1", False),  # a class body: ran at import
        (b"y = x + 1", b"y = x + 2", False),  # a kernel: the GPU compiles its body from the source
        (b"def forward(self, q)", b"def forward(self, q, k=1)", False),  # a default value: ran at import
    ],
)
def test_a_skeleton_changes_with_import_time_code_only(old, new, same):
    assert BASE.count(old) == 1
    assert (skeleton_digest(BASE) == skeleton_digest(BASE.replace(old, new))) is same


def test_the_recorder_names_the_functions_a_call_ran(tmp_path):
    """On this Python, and on 3.12+ (``sys.monitoring``) where an interpreter of it is on PATH."""
    (tmp_path / "ran_mod.py").write_text("class C:\n    def f(self):\n        return 1\n\ndef g():\n    return 2\n")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import ran_mod\n"
        "from sglfix.execution.entered import record_run\n"
        "out = record_run(ran_mod.C().f, ran=True)\n"
        "again = record_run(ran_mod.C().f, ran=True)\n"  # a second recorder sees the code again
        "names = lambda o: sorted(c.co_qualname for c in o.ran if c.co_filename.startswith(sys.argv[1]))\n"
        "print(names(out), names(again), out.value)\n"
    )
    pythons = [sys.executable]
    for name in ("python3.13", "python3.12"):
        found = shutil.which(name)
        if found and sys.version_info < (3, 12):
            works = subprocess.run([found, "-c", "import sys; assert sys.version_info >= (3, 12)"], capture_output=True)
            if works.returncode == 0:
                pythons.append(found)
                break
    for python in pythons:
        r = subprocess.run(
            [python, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
        assert r.returncode == 0, (python, r.stderr[-2000:])
        assert r.stdout.split() == ["['C.f']", "['C.f']", "1"], (python, r.stdout)


# -- the reproduction: a second run serves every cell; an edited toggle re-runs its cells only ----


def test_a_second_run_serves_every_cell_and_an_edited_toggle_reruns_its_own(tmp_path):
    toggles = tmp_path / "toggles"
    shutil.copytree(ROOT / "toggles", toggles, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    store = tmp_path / "store"
    pre = ("--toggles", str(toggles))
    args = ("-s", "triton-decode*", "-s", "trtllm*", "--cache", str(store))
    first = _matrix(*args, out=tmp_path / "1.json", pre=pre)
    assert first["store"]["served"] == 0 and first["store"]["ran"] == len(first["cells"]) > 20
    assert not any(c.get("stored") for c in first["cells"])

    second = _matrix(*args, out=tmp_path / "2.json", pre=pre)
    assert second["store"] == {"path": str(store), "served": len(first["cells"]), "ran": 0}
    assert second["workers"] == 0, "a run the store answers whole starts no worker"
    assert {k: c["verdict"] for k, c in _cells(tmp_path / "2.json").items()} == {
        k: c["verdict"] for k, c in _cells(tmp_path / "1.json").items()
    }

    edited = toggles / "21987.yaml"
    text = edited.read_text()
    assert text.count("summary: replay writes cu_seqlens_q") == 1
    edited.write_text(text.replace("summary: replay writes cu_seqlens_q", "summary: the replay writes cu_seqlens_q"))
    _matrix(*args, out=tmp_path / "3.json", pre=pre)
    cells = _cells(tmp_path / "3.json")
    ran = {k for k, c in cells.items() if not c.get("stored")}
    # Exactly the cells of the sets that revert the edited part (21987 whole, here).
    assert ran == {k for k in cells if "21987" in k.split("::")[0]} != set(), sorted(ran)

    fresh = _matrix(*args[:-2], "--no-cache", out=tmp_path / "fresh.json", pre=pre)
    assert "store" not in fresh
    assert {k: c["verdict"] for k, c in _cells(tmp_path / "3.json").items()} == {
        k: c["verdict"] for k, c in _cells(tmp_path / "fresh.json").items()
    }


def test_cache_options_are_checked_before_any_cell(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    cell = ("run", "-s", "triton-decode*", "--device", "cpu")
    r = run_cli(*cell, "--cache", str(blocked / "x"), env=ON)
    assert_one_line_error(r, "--cache", "cannot write there")
    r = run_cli(*cell, "--cache", str(blocked), env=ON)
    assert_one_line_error(r, f"--cache {blocked}", "a file, not a folder")
    r = run_cli(*cell, "--cache", "", env=ON)
    assert_one_line_error(r, "--cache ''", "give the result store's folder")
    r = run_cli(*cell, "--cache", "/proc/sglfix-store", env=ON)  # a folder no one can make, root included
    assert_one_line_error(r, "--cache /proc/sglfix-store", "cannot write there")
    r = run_cli(*cell, "--cache", str(tmp_path), "--no-cache", env=ON)
    assert_one_line_error(r, "--cache DIR", "--no-cache")
    r = run_cli(*cell, "--verify-store", "2", "--no-cache", env=ON)
    assert_one_line_error(r, "--verify-store", "--no-cache")
    r = run_cli(*cell, "--verify-store", "-1", "--cache", str(tmp_path), env=ON)
    assert_one_line_error(r, "--verify-store -1")
    assert not (tmp_path / "results.sqlite").exists()


# -- the classes of stale answers: each served verdict is the verdict of a run without the store --
#
# The reproduction is copied beside a copy of sglfix (every file a link to this checkout's), as an
# editable install lays them out: sglfix's package finds ``sglfix.backends`` in a folder of its
# own, outside sglfix's files. A file replaced there is an edit of the code under test, made
# between two runs as a developer makes one.

ATTENTION = Path("backends") / "kernels" / "ops" / "attention"
DECODE = ("-s", "triton-decode*", "--jobs", "1")  # 12 cells, one worker: cells share its caches


def _site(tmp: Path) -> Path:
    """``tmp/site``, for PYTHONPATH: the sglfix this test imports, linked file by file, its
    ``__path__`` reaching ``tmp/code`` too, where the reproduction's files are linked below
    ``backends``."""
    import sglfix
    from sglfix.common.codebase import package_dir

    here = Path(sglfix.__file__).parent
    pkg, code = tmp / "site" / "sglfix", tmp / "code"
    pkg.mkdir(parents=True)
    code.mkdir()
    own = ("__init__.py", "backends", "profiles", "scenarios", "toggles")
    for entry in here.iterdir():
        if entry.name != "__pycache__" and entry.name not in own:
            (pkg / entry.name).symlink_to(entry)
    init = (here / "__init__.py").read_text()
    # The same text in every copy (sglfix's own files are in the key): ``code`` found from here.
    reach = "__import__('os').path"
    (pkg / "__init__.py").write_text(
        f"{init}\n__path__.append({reach}.join({reach}.dirname({reach}.dirname({reach}.dirname("
        f"{reach}.abspath(__file__)))), 'code'))\n"
    )
    for name in own[1:]:
        where = package_dir(f"sglfix.{name}")
        assert where is not None, name
        if name == "backends":
            shutil.copytree(where, code / name, copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (pkg / name).symlink_to(where)
    return tmp / "site"


def _path(site: Path, rel: Path) -> Path:
    """A file of the copied reproduction (``backends/...``)."""
    return site.parent / "code" / rel


def _write(site: Path, rel: Path, text: str) -> None:
    path = _path(site, rel)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)


def _replace(site: Path, rel: Path, old: str, new: str) -> None:
    path = _path(site, rel)
    text = path.read_text()
    assert text.count(old) == 1, f"{rel} no longer holds {old!r} once"
    _write(site, rel, text.replace(old, new))


def _run(site: Path, name: str, *args: str, store: Path | None, env: dict | None = None, tmp: Path) -> dict:
    """``sglfix run`` of the copied reproduction; its cells by id."""
    out = tmp / name
    where = ("--cache", str(store)) if store is not None else ("--no-cache",)
    r = run_cli(
        "run", *args, "--device", "cpu", *where, "--json", str(out),
        env={**ON, "PYTHONPATH": str(site), **(env or {})}, cwd=str(tmp), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code in (0, 1), (r.code, r.out[-2000:], r.err[-2000:])
    return _cells(out)


def _verdicts(cells: dict) -> dict:
    return {k: c["verdict"] for k, c in cells.items()}


def _served(cells: dict) -> set:
    return {k for k, c in cells.items() if c.get("stored")}


# block_sizes cached per head dim (the first cell of a worker fills it, the others read it) and a
# limit computed at import by a helper no cell runs.
_CACHED = (
    ("import os\n", "import functools\nimport os\n\nfrom .limits import BLOCK_M\n"),
    ("def block_sizes(", "@functools.lru_cache(maxsize=None)\ndef block_sizes("),
    ("    block_d = 16\n", "    if BLOCK_M != 32:\n        raise ValueError(f'BLOCK_M {BLOCK_M}')\n    block_d = 16\n"),
)
_LIMITS = '"""A limit computed at import."""\n\n\ndef _block_m():\n    return 32\n\n\nBLOCK_M = _block_m()\n'


def test_state_of_earlier_cells_and_import_time_helpers_are_in_the_key(tmp_path):
    """(a) An ``lru_cache`` filled by an earlier cell of the worker, whose function is then edited
    to raise: the later cells read the cache, yet a fresh run crashes in every one. (b) A
    constant computed at import by a helper no cell enters, edited: every cell crashes fresh.
    Undoing an edit is served again (a cell keeps an entry per state)."""
    site = _site(tmp_path)
    common = ATTENTION / "common.py"
    text = _path(site, common).read_text()
    for old, new in _CACHED:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    _write(site, common, text)
    _write(site, ATTENTION / "limits.py", _LIMITS)
    store = tmp_path / "store"
    first = _run(site, "1.json", *DECODE, store=store, tmp=tmp_path)
    assert set(_verdicts(first).values()) == {"PASS"} and len(first) > 4

    _replace(site, ATTENTION / "limits.py", "return 32", "return 16")  # (b)
    second = _run(site, "2.json", *DECODE, store=store, tmp=tmp_path)
    fresh = _run(site, "2-fresh.json", *DECODE, store=None, tmp=tmp_path)
    assert _verdicts(second) == _verdicts(fresh) and set(_verdicts(fresh).values()) == {"CRASH"}, _verdicts(second)

    _replace(site, ATTENTION / "limits.py", "return 16", "return 32")
    undone = _run(site, "3.json", *DECODE, store=store, tmp=tmp_path)
    assert _served(undone) == set(undone) and _verdicts(undone) == _verdicts(first)

    _replace(site, common, "    block_d = 16\n", "    raise RuntimeError('edited')\n    block_d = 16\n")  # (a)
    fourth = _run(site, "4.json", *DECODE, store=store, tmp=tmp_path)
    fresh = _run(site, "4-fresh.json", *DECODE, store=None, tmp=tmp_path)
    assert _verdicts(fourth) == _verdicts(fresh) and set(_verdicts(fresh).values()) == {"CRASH"}, _verdicts(fourth)


def test_a_file_edited_while_the_run_runs_is_not_stored(tmp_path):
    """(d) The first cell rewrites a file its worker already imported (as an editor saving it
    mid-run would): the run's results are those of the old file, so none is filed under the new
    one; the next run runs the new file."""
    site = _site(tmp_path)
    common = ATTENTION / "common.py"
    text = _path(site, common).read_text()
    hook = (
        "\n\ndef _edit_once():\n"
        "    import pathlib\n"
        "    here, raising = pathlib.Path(__file__), '    raise ' + 'RuntimeError(1)\\n'\n"
        "    text = here.read_text()\n"
        "    if raising not in text:\n"
        "        here.write_text(text.replace('    block_d = 16\\n', raising + '    block_d = 16\\n', 1))\n"
    )
    assert text.count("    block_d = 16\n") == 1
    _write(site, common, text.replace("    block_d = 16\n", "    _edit_once()\n    block_d = 16\n") + hook)
    store = tmp_path / "store"
    first = _run(site, "1.json", *DECODE, store=store, tmp=tmp_path)
    assert set(_verdicts(first).values()) == {"PASS"}
    assert "    raise RuntimeError(1)\n" in _path(site, common).read_text()
    second = _run(site, "2.json", *DECODE, store=store, tmp=tmp_path)
    fresh = _run(site, "2-fresh.json", *DECODE, store=None, tmp=tmp_path)
    assert _verdicts(second) == _verdicts(fresh) and set(_verdicts(fresh).values()) == {"CRASH"}, _verdicts(second)


def test_interpreter_flags_are_in_the_key(tmp_path):
    """(f) An assertion in the code under test: it crashes the cells, and under PYTHONOPTIMIZE
    it is not there."""
    site = _site(tmp_path)
    _replace(
        site, ATTENTION / "common.py", "    block_d = 16\n", "    assert head_dim < 0, 'checked'\n    block_d = 16\n"
    )
    store = tmp_path / "store"
    first = _run(site, "1.json", *DECODE, store=store, tmp=tmp_path)
    assert set(_verdicts(first).values()) == {"CRASH"}
    optimized = {"PYTHONOPTIMIZE": "1"}
    second = _run(site, "2.json", *DECODE, store=store, env=optimized, tmp=tmp_path)
    fresh = _run(site, "2-fresh.json", *DECODE, store=None, env=optimized, tmp=tmp_path)
    assert _verdicts(second) == _verdicts(fresh) and set(_verdicts(fresh).values()) == {"PASS"}, _verdicts(second)


def test_the_worker_count_is_not_in_the_key_and_what_cells_read_is(monkeypatch):
    """How many workers ran a cell (SGLFIX_JOBS, as --jobs) does not change its result; a
    variable the workers read (the kernel memo) is part of the key."""
    from sglfix import codebases
    from sglfix.execution.store.keys import context_key
    from sglfix.toggling.profiles import get_profile

    def key() -> str:
        cb = codebases.get_codebase("reproduction")
        return context_key(device="cpu", codebase=cb, profile=get_profile("reproduction"))[0]

    monkeypatch.delenv("SGLFIX_JOBS", raising=False)
    alone = key()
    monkeypatch.setenv("SGLFIX_JOBS", "4")
    assert key() == alone
    monkeypatch.setenv("SGLFIX_KERNEL_MEMO", "0")
    assert key() != alone


def test_installed_packages_are_keyed_by_their_files_and_only_those_imported(tmp_path):
    """(e) Triton's own source edited in place at the same version re-runs the cells of every
    process that imported it; a package installed beside it that no worker imports (as pytest)
    re-runs nothing."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    assert spec is not None and spec.submodule_search_locations
    tree = tmp_path / "tree"
    installed = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(installed, tree / "triton", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": os.pathsep.join((str(tree), str(_site(tmp_path))))}
    store = tmp_path / "store"
    args = ("run", "-s", "triton-decode*", "--device", "cpu", "--cache", str(store))

    def run(name: str) -> dict:
        r = run_cli(
            *args, "--json", str(tmp_path / name), env={**ON, **env}, cwd=str(tmp_path), timeout=600, subprocess=True
        )
        assert r.code in (0, 1), (r.code, r.err[-2000:])
        return _cells(tmp_path / name)

    first = run("1.json")
    assert not _served(first)
    unrelated = tree / "sglfix_unrelated_pkg-1.0.dist-info"
    unrelated.mkdir()
    (unrelated / "METADATA").write_text("Metadata-Version: 2.1\nName: sglfix-unrelated-pkg\nVersion: 1.0\n")
    (tree / "sglfix_unrelated_pkg.py").write_text("")
    second = run("2.json")
    assert _served(second) == set(second) and _verdicts(second) == _verdicts(first)

    edited = tree / "triton" / "language" / "core.py"
    text = edited.read_text()
    edited.unlink()
    edited.write_text(text + "\n# edited in place\n")
    third = run("3.json")
    assert not _served(third) and _verdicts(third) == _verdicts(first)


def test_a_run_the_store_answers_whole_reports_the_code_base_it_resolves(tmp_path):
    """Two copies of the same code base: the second's run is served whole and starts no worker,
    and its report names the second copy (what this run would import), not the first's folder."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = _site(tmp_path / "a"), _site(tmp_path / "b")
    store = tmp_path / "store"
    _run(one, "1.json", *DECODE, store=store, tmp=tmp_path)
    second = _run(two, "2.json", *DECODE, store=store, tmp=tmp_path)
    assert _served(second) == set(second)
    report = json.loads((tmp_path / "2.json").read_text())
    assert report["workers"] == 0
    where = report["codebase"]["path"]
    assert f"{os.sep}b{os.sep}code{os.sep}" in where and f"{os.sep}a{os.sep}code{os.sep}" not in where, where


@pytest.mark.parametrize(
    ("source", "leaves"),
    [
        ("def f():\n    global X\n    X = 1\n", True),
        ("def f(k, v):\n    _REGISTRY[k] = v\n", True),
        ("def f():\n    os.environ.pop('X', None)\n", True),
        ("def f(cls, v):\n    cls.default = v\n", True),
        ("def f(self, v):\n    self.__class__.seen = v\n", True),
        ("def f(self, v):\n    self.value = v\n    self.items.append(v)\n", False),
        ("def f(x):\n    y = [x]\n    y.append(1)\n    return sum(y)\n", False),
    ],
)
def test_code_that_can_leave_state_for_a_later_cell_is_told(source, leaves):
    from sglfix.execution.store.process import leaves_state

    namespace: dict = {}
    exec(compile(source, "<probe>", "exec"), namespace)
    assert leaves_state(namespace["f"].__code__) is leaves
    if not leaves and "self" in source:  # the same method of an object a module holds
        assert leaves_state(namespace["f"].__code__, shared_self=True)


def _store_with(tmp: Path, *, absent: tuple = ()) -> tuple:
    """A store for ``tmp`` (a code base of one file) and a worker's record of a process that
    ran its one function and looked for ``absent`` in vain."""
    from sglfix.execution.store import ResultStore

    (tmp / "pkg").mkdir(exist_ok=True)
    (tmp / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    store = ResultStore(str(tmp / "store"), context="c", parts={}, top=str(tmp))
    st = os.stat(tmp / "pkg" / "mod.py")
    proc = {"boot": [], "imported": {"pkg/mod.py": [st.st_mtime_ns, st.st_size]}, "roots": {}, "absent": list(absent)}
    return store, {"ran": ["pkg/mod.py::f"], "process": "p1", "proc": proc}


def _result(verdict: str, **finding) -> CellResult:
    result = CellResult(scenario="s", toggles=[], device="cpu")
    if finding:
        result.add(verdict, finding.pop("message"), **finding)
    return result.finish()


def test_a_library_that_could_not_be_mapped_is_not_stored_as_a_crash(tmp_path):
    """(c) The first run cannot map a library (the machine's state at that moment, as under memory
    pressure): its CRASH is not kept, and the next run, which can, runs the cells."""
    site = _site(tmp_path)
    common = ATTENTION / "common.py"
    fails = _path(site, ATTENTION / "mapping-fails")
    _replace(
        site,
        common,
        "    block_d = 16\n",
        "    if (__import__('pathlib').Path(__file__).parent / 'mapping-fails').exists():\n"
        "        raise OSError('libkernels.so: failed to map segment from shared object')\n"
        "    block_d = 16\n",
    )
    fails.write_text("")
    store = tmp_path / "store"
    first = _run(site, "1.json", *DECODE, store=store, tmp=tmp_path)
    assert set(_verdicts(first).values()) == {"CRASH"}
    fails.unlink()
    second = _run(site, "2.json", *DECODE, store=store, tmp=tmp_path)
    fresh = _run(site, "2-fresh.json", *DECODE, store=None, tmp=tmp_path)
    assert _verdicts(second) == _verdicts(fresh) and set(_verdicts(fresh).values()) == {"PASS"}, _verdicts(second)


def test_a_failure_a_rerun_could_change_is_never_stored(tmp_path):
    """(c) A library that could not be mapped, a dependency that failed to import, sglfix's own
    failure: not filed; a crash of the code itself is."""
    store, worker = _store_with(tmp_path)
    kept = _result("CRASH", message="ValueError: bad shape [run, x.py:3 in f]", type="ValueError")
    transient = [
        _result("CRASH", message="OSError: libtriton.so: failed to map segment from shared object", type="OSError"),
        _result("CRASH", message="ModuleNotFoundError: No module named 'flash_mla'", type="ModuleNotFoundError"),
        _result("ERROR", message="sglfix failed in judge: KeyError: 'x'", type="KeyError"),
    ]
    for i, result in enumerate([kept, *transient]):
        store.put(f"k{i}", result, deps=store.deps_of(worker))
    store.close()
    again, _ = _store_with(tmp_path)
    assert again.get("k0") is not None
    assert [again.get(f"k{i}") for i in range(1, 4)] == [None, None, None]
    again.close()


def test_a_module_looked_for_in_vain_and_installed_since_makes_its_results_miss(tmp_path, monkeypatch):
    """A SKIP for a package that is not installed names that package: installed, the cell runs."""
    name = "sglfix_store_absent_probe"
    store, worker = _store_with(tmp_path, absent=(name,))
    store.put("k", _result("SKIP", message=f"{name} is not installed"), deps=store.deps_of(worker))
    store.close()
    again, _ = _store_with(tmp_path, absent=(name,))
    assert again.get("k") is not None
    again.close()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    again, _ = _store_with(tmp_path, absent=(name,))
    assert again.get("k") is None
    again.close()


def test_damaged_rows_are_misses_and_verify_store_fails_loudly_on_a_wrong_answer(tmp_path):
    """(g) A row of bad JSON and a row whose verdict is none: misses, dropped, the run goes on.
    A row that reads well but says what a fresh run does not is served (nothing tells it from a
    right one): ``--verify-store`` re-runs served cells and fails, naming the cell and both
    verdicts, and drops the entry."""
    import sqlite3

    site = _site(tmp_path)
    store = tmp_path / "store"
    first = _run(site, "1.json", *DECODE, store=store, tmp=tmp_path)
    ids = sorted(first)
    assert len(ids) >= 3 and set(_verdicts(first).values()) == {"PASS"}
    conn = sqlite3.connect(store / "results.sqlite")
    rows = {json.loads(r)["scenario"]: k for k, r in conn.execute("SELECT key, result FROM entries")}
    bad_json, garbage, wrong = (rows[i.split("::")[1]] for i in ids[:3])
    conn.execute("UPDATE entries SET result = '{\"scenario\": ' WHERE key = ?", (bad_json,))
    row = json.loads(conn.execute("SELECT result FROM entries WHERE key = ?", (garbage,)).fetchone()[0])
    conn.execute("UPDATE entries SET result = ? WHERE key = ?", (json.dumps({**row, "verdict": "GREAT"}), garbage))
    row = json.loads(conn.execute("SELECT result FROM entries WHERE key = ?", (wrong,)).fetchone()[0])
    row = {**row, "verdict": "DIVERGE", "findings": [{"verdict": "DIVERGE", "message": "max|diff| 1.0"}]}
    conn.execute("UPDATE entries SET result = ? WHERE key = ?", (json.dumps(row), wrong))
    conn.commit()
    conn.close()

    second = _run(site, "2.json", *DECODE, store=store, tmp=tmp_path)  # no internal error: misses
    assert _verdicts(second) == {**_verdicts(first), ids[2]: "DIVERGE"}
    assert _served(second) == set(ids) - {ids[0], ids[1]}

    r = run_cli(
        "run", *DECODE, "--device", "cpu", "--cache", str(store), "--verify-store", str(len(ids)),
        env={**ON, "PYTHONPATH": str(site)}, cwd=str(tmp_path), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, (r.code, r.err[-2000:])
    assert "internal error" not in r.err and "Traceback" not in r.err
    lines = [line for line in r.err.splitlines() if line.startswith("sglfix: error:")]
    assert len(lines) == 1 and ids[2] in lines[0] and "served DIVERGE" in lines[0] and "fresh PASS" in lines[0], r.err
    assert ids[0] not in lines[0] and ids[1] not in lines[0]  # run again fresh by the run before

    fourth = _run(site, "4.json", *DECODE, "--verify-store", "2", store=store, tmp=tmp_path)
    assert _verdicts(fourth) == _verdicts(first)
    assert _served(fourth) == set(ids) - {ids[2]}  # the wrong entry was dropped
    report = json.loads((tmp_path / "4.json").read_text())
    assert report["store"]["verified"] == 2


# -- real sglang from a source tree: an edit re-runs the cells that ran the file, and only them ----

SCENARIOS = ("-s", "sglang-triton-decode@cg=eager,gpu_only=off", "-s", "fi-draft-fits@cg=graph")
TRITON = Path("srt") / "layers" / "attention" / "triton_backend.py"
TRTLLM = Path("srt") / "layers" / "attention" / "trtllm_mla_backend.py"
IN_A_CALL = "            layer.scaling,\n"


def test_a_crash_served_after_an_edit_above_its_function_cites_the_line_the_file_holds_now(tmp_path):
    """A result that cites a line is keyed on the positions inside the functions of the file it
    names, counted from each function's first line: an edit above the function (lines inserted
    before it) moves the function whole, the result is served, and the line it cites moves with
    it, as a run without the store would cite it."""
    site = _site(tmp_path)
    backend = Path("backends") / "srt" / "layers" / "attention" / "triton_backend.py"
    _replace(
        site,
        backend,
        "        bs = forward_batch.batch_size\n",
        "        bs = forward_batch.batch_size\n        raise RuntimeError('planted')\n",
    )
    store = tmp_path / "store"
    cell = ("-s", "triton-decode@cg=eager,gpu_only=off", "--jobs", "1")
    first = _run(site, "1.json", *cell, store=store, tmp=tmp_path)
    (key,) = first
    said = first[key]["findings"][0]["message"]
    assert first[key]["verdict"] == "CRASH" and "triton_backend.py:" in said, first
    text = _path(site, backend).read_text()
    _write(site, backend, "# one\n# two\n# three\n" + text)
    moved = _run(site, "2.json", *cell, store=store, tmp=tmp_path)
    fresh = _run(site, "3.json", *cell, store=None, tmp=tmp_path)
    assert moved[key].get("stored"), "an edit above the function re-ran its crash"
    assert moved[key]["findings"][0]["message"] == fresh[key]["findings"][0]["message"] != said
    line = int(said.split("triton_backend.py:")[1].split()[0])
    assert f"triton_backend.py:{line + 3} " in moved[key]["findings"][0]["message"]


def _edit(tree: Path, rel: Path, old: str, new: str) -> None:
    """Replace the link ``tree/sglang/rel`` with a file of its text edited (the installed file stays)."""
    path = tree / "sglang" / rel
    text = path.read_text()
    assert text.count(old) >= 1, f"{rel} no longer holds {old!r}"
    path.unlink()
    path.write_text(text.replace(old, new, 1))


def _insert(tree: Path, rel: Path, qualname: str, statement: str) -> None:
    """A statement put first in the body of the function ``qualname`` of ``tree/sglang/rel`` (the
    link replaced by a file of its own), as the store's bench edits it."""
    bench = str(ROOT / "bench")
    sys.path.insert(0, bench)
    try:
        from store_bench import insert_statement
    finally:
        sys.path.remove(bench)
    insert_statement(tree / "sglang" / rel, qualname, statement)


def test_an_edit_to_sglang_reruns_exactly_the_cells_that_ran_the_function(tmp_path):
    from real_sglang import require_sglang, sglang_tree

    from sglfix.execution.store import stored_cells_naming

    require_sglang()
    tree = sglang_tree(tmp_path)
    env = {"PYTHONPATH": str(tree)}
    store = tmp_path / "store"
    # One worker: what is asserted is which cells run, not how they are dealt, and each real-sglang
    # worker's boot costs more than the cells of a two-scenario matrix.
    args = ("--profile", "sglang-0.5.23", *SCENARIOS, "--cache", str(store), "--jobs", "1")

    def matrix(name: str) -> dict[str, dict]:
        _matrix(*args, out=tmp_path / name, env=env, cwd=str(tmp_path))
        return _cells(tmp_path / name)

    first = matrix("1.json")
    assert not any(c.get("stored") for c in first.values())

    # A statement in TritonAttnBackend.forward_decode: the cells whose record names it run again
    # (the Triton decode scenario's: an unreached one stands on its baseline, which ran it); the
    # FlashInfer draft cells are served (so a run with nothing changed is served whole: no
    # separate run for that).
    decode = "TritonAttnBackend.forward_decode"
    named = {
        f"{','.join(t) or 'baseline'}::{s}" for s, t in stored_cells_naming(str(store), [f"sglang/{TRITON}::{decode}"])
    }
    assert named and all("::sglang-triton-decode" in k for k in named), sorted(named)
    _insert(tree, TRITON, decode, "_edited = 0")
    third = matrix("3.json")
    assert {k for k, c in third.items() if not c.get("stored")} == named

    # A comment in that file (the lines below it move: only a result that cites a line would run
    # again), and an edit inside a function no cell entered (the TRT-LLM MLA backend's, imported by
    # every worker): nothing runs.
    _edit(tree, TRITON, IN_A_CALL, "            # edited\n" + IN_A_CALL)
    _edit(tree, TRTLLM, "\n        return ", "\n        # edited\n        return ")
    assert all(c.get("stored") for c in matrix("4.json").values())

    # Its module level ran at import in every worker: everything runs again. That run serves
    # nothing, so it is the fresh run the partly served one is compared with.
    path = tree / "sglang" / TRTLLM
    path.write_text(path.read_text() + "\n_EDITED = 1\n")  # already a file of its own (above)
    fifth = matrix("5.json")
    assert not any(c.get("stored") for c in fifth.values())
    assert {k: c["verdict"] for k, c in third.items()} == {k: c["verdict"] for k, c in fifth.items()}


_LAZY_PROBE = r"""
import json, os
os.environ["TRITON_INTERPRET"] = "1"
from sglfix import codebases
from sglfix.execution.serve import _import_under_test
cb = codebases.get_codebase("reproduction")
codebases.activate(cb)
_import_under_test(cb)
import sglfix.harness.cell as cellmod
from sglfix.backends.srt.layers.attention import flashinfer_backend as fb
from sglfix.execution.session import Session
from sglfix.scenario import load_scenarios
scenario = {s.name: s for s in load_scenarios()}["fi-decode@cg=eager"].to_json()
session = Session(device="cpu", allowed_prefixes=None)
real, seen = cellmod.run_cell, []
def spy(*args, **kwargs):
    seen.append(fb.global_workspace_buffer is None)  # what the cell found at its start
    return real(*args, **kwargs)
cellmod.run_cell = spy
verdicts = [session.handle({"id": i, "toggles": [], "scenario": scenario, "deps": True})["result"]["verdict"]
            for i in range(2)]
print(json.dumps({"verdicts": verdicts, "unset_at_start": seen, "filled_after": fb.global_workspace_buffer is not None}))
"""


def test_a_recorded_cell_starts_with_lazy_module_state_unset(tmp_path):
    """A cell whose record the store keeps finds lazy module state as a fresh worker does, so the
    code that fills it runs, and is recorded, in every such cell: not only in the first cell of a
    worker (a cell that read a workspace an earlier cell made would not list the file that makes
    it, and an edit there would serve it stale)."""
    out = run_probe(_LAZY_PROBE, cwd=tmp_path, env={"SGLANG_DEBUG_REVERT_PR": "0"}, timeout=300)
    assert out == {"verdicts": ["PASS", "PASS"], "unset_at_start": [True, True], "filled_after": True}, out
