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
from clihelp import assert_one_line_error, run_cli, run_probe

from sglfix.execution.store.fingerprint import skeleton_digest

ROOT = Path(__file__).resolve().parent.parent
ON = {"SGLFIX_STORE": ""}  # the suite turns the store off (conftest); these tests name a folder


def _cells(path: Path) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(path.read_text())["cells"]}


def _matrix(
    *args: str, out: Path, env: dict | None = None, cwd: str | None = None, timeout: float = 600, pre: tuple = ()
):
    r = run_cli(
        *pre, "matrix", *args, "--device", "cpu", "--json", str(out), env={**ON, **(env or {})}, cwd=cwd,
        timeout=timeout,
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


def test_the_recorder_names_the_files_a_call_ran(tmp_path):
    """On this Python, and on 3.12+ (``sys.monitoring``) where an interpreter of it is on PATH."""
    (tmp_path / "ran_mod.py").write_text("def f():\n    return 1\n")
    (tmp_path / "idle_mod.py").write_text("def g():\n    return 2\n")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import ran_mod, idle_mod\n"
        "from sglfix.execution.entered import record_run\n"
        "out = record_run(ran_mod.f, files=True)\n"
        "again = record_run(ran_mod.f, files=True)\n"  # a second recorder sees the code again
        "names = lambda o: sorted(p.rsplit('/', 1)[-1] for p in o.files if p.startswith(sys.argv[1]))\n"
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
        assert r.stdout.split() == ["['ran_mod.py']", "['ran_mod.py']", "1"], (python, r.stdout)


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
    r = run_cli("run", "-s", "triton-decode*", "--device", "cpu", "--cache", str(blocked / "x"), env=ON)
    assert_one_line_error(r, "--cache", "cannot write there")
    r = run_cli("run", "-s", "triton-decode*", "--device", "cpu", "--cache", str(tmp_path), "--no-cache", env=ON)
    assert_one_line_error(r, "--cache DIR", "--no-cache")


# -- real sglang from a source tree: an edit re-runs the cells that ran the file, and only them ----

SCENARIOS = ("-s", "sglang-triton-decode@cg=eager,gpu_only=off", "-s", "fi-draft-fits@cg=graph")
TRITON = Path("srt") / "layers" / "attention" / "triton_backend.py"
TRTLLM = Path("srt") / "layers" / "attention" / "trtllm_mla_backend.py"
IN_A_CALL = "            layer.scaling,\n"


def _edit(tree: Path, rel: Path, old: str, new: str) -> None:
    """Replace the link ``tree/sglang/rel`` with a file of its text edited (the installed file stays)."""
    path = tree / "sglang" / rel
    text = path.read_text()
    assert text.count(old) >= 1, f"{rel} no longer holds {old!r}"
    path.unlink()
    path.write_text(text.replace(old, new, 1))


def test_an_edit_to_sglang_reruns_exactly_the_cells_that_ran_the_file(tmp_path):
    from real_sglang import require_sglang
    from test_source_tree import _tree

    require_sglang()
    tree = _tree(tmp_path)
    env = {"PYTHONPATH": str(tree)}
    store = tmp_path / "store"
    args = ("--profile", "sglang-0.5.23", *SCENARIOS, "--cache", str(store))

    def matrix(name: str, *more: str) -> dict[str, dict]:
        run_args = args if "--no-cache" not in more else args[:-2]
        _matrix(*run_args, *more, out=tmp_path / name, env=env, cwd=str(tmp_path))
        return _cells(tmp_path / name)

    first = matrix("1.json")
    assert not any(c.get("stored") for c in first.values())
    assert all(c.get("stored") for c in matrix("2.json").values())

    # A comment inside the Triton backend's decode call: the Triton cells ran that file, the
    # FlashInfer draft cells did not.
    _edit(tree, TRITON, IN_A_CALL, "            # edited\n" + IN_A_CALL)
    third = matrix("3.json")
    ran = {k for k, c in third.items() if not c.get("stored")}
    # Every cell of the Triton scenario (an unreached one stands on its baseline, which ran the file).
    assert ran == {k for k in third if "::sglang-triton-decode" in k}, sorted(ran)

    # Inside a function no cell entered (the TRT-LLM MLA backend's, imported by every worker): nothing.
    _edit(tree, TRTLLM, "\n        return ", "\n        # edited\n        return ")
    assert all(c.get("stored") for c in matrix("4.json").values())

    # Its module level ran at import in every worker: everything runs again.
    path = tree / "sglang" / TRTLLM
    path.write_text(path.read_text() + "\n_EDITED = 1\n")  # already a file of its own (above)
    fifth = matrix("5.json")
    assert not any(c.get("stored") for c in fifth.values())

    fresh = matrix("fresh.json", "--no-cache")
    assert {k: c["verdict"] for k, c in fifth.items()} == {k: c["verdict"] for k, c in fresh.items()}
    assert {k: c["verdict"] for k, c in third.items()} == {k: c["verdict"] for k, c in fresh.items()}


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
