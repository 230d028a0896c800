"""The result store's folder and its layer around the pool: the layer answers the cells the store
holds and runs only the others (no pool at all when it holds every one), a folder of another
schema is emptied and made again, a store folder is tagged and explained, ``sglfix cache show |
prune | clear`` read and empty it (and nothing else), and bisect is served from it on a second run.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.execution.reach import RecordingCell, SettledCell
from sglfix.execution.store import ResultStore
from sglfix.execution.store.folder import (
    MARKER,
    RESULTS_FILE,
    SCHEMA,
    TAG,
    clear_store,
    folder_state,
    parse_age,
    prepare_folder,
    prune_store,
    summarize_store,
)
from sglfix.execution.store.layer import StoredPool
from sglfix.harness.cell import not_reached_result
from sglfix.harness.result import CellResult

ON = {"SGLFIX_STORE": ""}  # the suite turns the store off (conftest); these tests name a folder
ONE = "triton-decode@cg=eager,gpu_only=off"


# -- the layer, without workers -------------------------------------------------------------------


@dataclass(frozen=True)
class Scen:
    name: str

    def to_json(self) -> dict:
        return {"name": self.name}


@dataclass(frozen=True)
class Cell:
    scenario: Scen
    toggles: tuple[str, ...] = ()


class Registry:
    """No candidate fixes; each revert changes nothing the key reads."""

    def __init__(self) -> None:
        self.candidates: dict = {}

    def select(self, rid: str) -> list:
        return []


class Workers:
    """A pool's answers (PASS; a baseline entered nothing), each with its worker's record of what
    the process ran (one function of a one-file code base); every cell it ran is kept."""

    def __init__(self, worker: dict) -> None:
        self.worker, self.ran = worker, []
        self.info = {"device": "cpu"}

    def run(self, cells, on_result=None, feed=None):
        queue, out = list(cells), []
        while queue:
            c = queue.pop(0)
            assert getattr(c, "answer", None) is None, "a cell with its answer reached a worker"
            self.ran.append(c)
            r = CellResult(scenario=c.scenario.name, toggles=list(c.toggles), device="cpu")
            if isinstance(c, RecordingCell):
                r.reached = []
            if c.scenario.name == "broken":
                r.add("ERROR", "sglfix failed: the worker could not start")
            r = r.finish()
            r.deps = dict(self.worker)
            out.append(r)
            if on_result is not None:
                on_result(r)
            if feed is not None:
                queue += feed(c, r)
        return out


def _layer(tmp: Path) -> tuple[StoredPool, list]:
    """A layer over the store at ``tmp/store`` (a code base of one file, ``tmp/pkg/mod.py``);
    the pools it opened."""
    (tmp / "pkg").mkdir(exist_ok=True)
    mod = tmp / "pkg" / "mod.py"
    if not mod.exists():
        mod.write_text("def f():\n    return 1\n")
    st = os.stat(mod)
    proc = {"boot": [], "imported": {"pkg/mod.py": [st.st_mtime_ns, st.st_size]}, "roots": {}, "absent": []}
    worker = {"ran": ["pkg/mod.py::f"], "process": "p1", "proc": proc}
    opened: list = []

    @contextmanager
    def open_pool(cells):
        opened.append(Workers(worker))
        yield opened[-1]

    store = ResultStore(str(tmp / "store"), context="c", parts={}, top=str(tmp))
    layer = StoredPool(
        store,
        open_pool=open_pool,
        registry=Registry(),
        reachability=True,
        fingerprint=False,
        served_info=lambda: {"device": "cpu", "workers": 0},
    )
    return layer, opened


def _same(a: CellResult, b: CellResult) -> bool:
    strip = lambda r: {k: v for k, v in r.to_json().items() if k != "stored"}  # noqa: E731
    return strip(a) == strip(b)


def test_the_layer_serves_what_the_store_holds_and_runs_only_the_rest(tmp_path):
    a, b, c = Scen("a"), Scen("b"), Scen("c")
    base = RecordingCell(c, (), ("pkg.mod.f",))
    unreached = not_reached_result("c", ["t"], device="cpu", same_as="PASS", targets=["pkg.mod.g"])

    def cells():
        return [base, Cell(a), Cell(b, ("t",))]

    def feed(cell, result):
        # The baseline back, a cell its probe answered (filed with the baseline's record, as a
        # NOT_REACHED cell runs nothing of its own).
        return [SettledCell(c, ("t",), unreached)] if cell is base else []

    layer, opened = _layer(tmp_path)
    with layer:
        first = layer.run(cells(), feed=feed)
    assert len(opened) == 1 and len(opened[0].ran) == 3 and layer.served == 0
    assert [(r.scenario, tuple(r.toggles)) for r in first] == [("c", ()), ("a", ()), ("b", ("t",)), ("c", ("t",))]
    assert not any(r.stored for r in first)

    layer, opened = _layer(tmp_path)
    seen: list = []
    with layer:
        second = layer.run(cells(), on_result=seen.append, feed=feed)
        info = layer.info
    assert opened == [], "a run the store answers whole opens no pool"
    assert layer.served == 4 and all(r.stored for r in second) and len(seen) == 4
    assert all(_same(x, y) for x, y in zip(first, second, strict=True))
    assert info == {"device": "cpu", "workers": 0}

    # A baseline asked to record more than its entry did is run again; nothing else is.
    layer, opened = _layer(tmp_path)
    with layer:
        third = layer.run([RecordingCell(c, (), ("pkg.mod.f", "pkg.mod.g")), Cell(a)])
    assert [(x.scenario.name, x.toggles) for x in opened[0].ran] == [("c", ())]
    assert not third[0].stored and third[1].stored


def test_a_failure_is_never_served_and_an_edit_reruns_through_the_layer(tmp_path):
    """What the store never keeps (ERROR) runs again; an edit of the function the cells ran makes
    them miss."""
    cells = lambda: [Cell(Scen("a")), Cell(Scen("broken"))]  # noqa: E731
    layer, _ = _layer(tmp_path)
    with layer:
        assert [r.verdict for r in layer.run(cells())] == ["PASS", "ERROR"]
    layer, opened = _layer(tmp_path)
    with layer:
        ok, broken = layer.run(cells())
    assert ok.stored and not broken.stored and [c.scenario.name for c in opened[0].ran] == ["broken"]
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    layer, opened = _layer(tmp_path)
    with layer:
        ok, _ = layer.run(cells())
    assert not ok.stored and len(opened[0].ran) == 2


# -- the folder: made, tagged, versioned, refused ----------------------------------------------------


def test_a_store_folder_is_marked_tagged_and_explained_when_made(tmp_path):
    where = tmp_path / "new" / "store"
    prepare_folder(str(where))
    assert (where / TAG).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    assert "sglfix cache prune" in (where / "README.md").read_text()
    assert json.loads((where / MARKER).read_text())["schema_version"] == SCHEMA
    assert folder_state(str(where)).kind == "store"
    # An empty folder made elsewhere becomes a store too; one of other files is refused, untouched.
    (tmp_path / "empty").mkdir()
    prepare_folder(str(tmp_path / "empty"))
    assert (tmp_path / "empty" / TAG).exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an sglfix result store"):
        prepare_folder(str(mine))
    assert sorted(os.listdir(mine)) == ["notes.txt"]


def _filled(tmp: Path) -> str:
    layer, _ = _layer(tmp)
    with layer:
        layer.run([Cell(Scen("a"))])
    return str(tmp / "store")


@pytest.mark.parametrize("marker", ["another schema", "unreadable", "none (an older sglfix)"])
def test_a_store_of_another_schema_is_emptied_and_made_again_with_one_line(tmp_path, capfd, marker):
    store = _filled(tmp_path)
    (Path(store) / "notes.txt").write_text("mine")
    path = Path(store) / MARKER
    if marker == "another schema":
        path.write_text(json.dumps({"kind": "sglfix result store", "schema_version": SCHEMA - 1}))
    elif marker == "unreadable":
        path.write_text("{")
    else:
        path.unlink()
    capfd.readouterr()
    layer, opened = _layer(tmp_path)
    with layer:
        (again,) = layer.run([Cell(Scen("a"))])
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "emptied and made again" in lines[0] and store in lines[0], lines
    assert not again.stored and len(opened) == 1, "an entry of another schema was read"
    assert json.loads(path.read_text())["schema_version"] == SCHEMA
    assert (Path(store) / "notes.txt").read_text() == "mine"  # not the store's: left alone


def test_cache_commands_refuse_a_folder_that_is_not_a_store_and_delete_nothing(tmp_path):
    from sglfix.execution.runner import check_store
    from sglfix.execution.settings import Settings

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / RESULTS_FILE).write_text("not ours")  # a store's name is no proof: the marker and tag are
    (mine / "notes.txt").write_text("mine")
    (mine / MARKER).write_text(json.dumps({"kind": "sglfix result store", "schema_version": SCHEMA}))
    for act in (clear_store, lambda d: prune_store(d, older_than_s=0), summarize_store):
        with pytest.raises(ConfigError, match=f"not an sglfix result store .*{TAG}"):
            act(str(mine))
    assert sorted(os.listdir(mine)) == sorted([RESULTS_FILE, "notes.txt", MARKER])
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=f"--cache {other}: that folder holds other files"):
        check_store(Settings(cache=str(other)))


def test_the_cache_commands_choose_the_folder_as_the_runs_do(tmp_path, monkeypatch):
    from sglfix.execution.runner import chosen_store_folder

    monkeypatch.setenv("SGLFIX_STORE", str(tmp_path / "env"))
    assert chosen_store_folder(None) == str(tmp_path / "env")
    assert chosen_store_folder(str(tmp_path / "given")) == str(tmp_path / "given")
    monkeypatch.setenv("SGLFIX_STORE", "0")
    with pytest.raises(ConfigError, match="SGLFIX_STORE=0 turns the result store off: give --cache DIR"):
        chosen_store_folder(None)
    with pytest.raises(ConfigError, match="--cache ''"):
        chosen_store_folder(" ")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("90m", 5400), ("12h", 43200), ("7d", 604800), ("2w", 1209600), ("1.5d", 129600)]
)
def test_an_age_is_a_number_and_a_unit(text, seconds):
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["7", "7x", "-1d", "d", "", "7 days"])
def test_a_bad_age_names_the_option_and_the_fix(text):
    with pytest.raises(ConfigError, match=r"--older-than .*e\.g\. --older-than 7d"):
        parse_age(text)


# -- the lifecycle on a store a real run filled --------------------------------------------------------


def _stamps(store: Path) -> tuple[float, float | None]:
    import datetime

    with sqlite3.connect(store / RESULTS_FILE) as conn:
        stored, used = conn.execute("SELECT stored, used FROM entries").fetchone()
    ts = lambda s: datetime.datetime.fromisoformat(s).timestamp() if s else None  # noqa: E731
    return ts(stored), ts(used)


def test_show_prune_and_clear_a_store_a_real_run_filled(tmp_path):
    store = tmp_path / "store"
    run = ("run", "-s", ONE, "--device", "cpu", "--cache", str(store))
    r = run_cli(*run, env=ON, timeout=600)
    assert r.code == 0, r.err[-2000:]
    (store / "notes.txt").write_text("mine")
    shown = summarize_store(str(store))
    parts = {p.kind: p for p in shown.parts}
    assert shown.schema_version == SCHEMA and shown.records == 1 == parts["results"].records
    assert parts["results"].bytes > 0 and parts["mutant memo"].records == 0 and parts["other"].records == 1
    written, used = _stamps(store)
    assert used is None

    r = run_cli(*run, "--json", str(tmp_path / "2.json"), env=ON, timeout=600)  # served: marked used
    assert json.loads((tmp_path / "2.json").read_text())["store"]["served"] == 1
    written_again, used = _stamps(store)
    assert written_again == written and used is not None and used > written
    r = run_cli("cache", "show", "--cache", str(store), env=ON)
    assert r.code == 0 and "results" in r.out and f"schema {SCHEMA}" in r.out, r.out + r.err

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    # Written before the cut, used after it: kept. Neither used nor written since: removed.
    middle = (written + used) / 2
    kept = prune_store(str(store), older_than_s=1.0, now=middle + 1.0)
    assert kept.records == 0 and summarize_store(str(store)).records == 1
    gone = prune_store(str(store), older_than_s=1.0, now=used + 2.0)
    assert gone.records == 1 and gone.parts[0].kind == "results" and gone.bytes >= 0
    assert summarize_store(str(store)).records == 0 and (store / "notes.txt").exists()

    r = run_cli("cache", "clear", "--cache", str(copy), "--json", env=ON)
    assert r.code == 0, r.err
    said = json.loads(r.out)
    assert said["records"] == 1 and said["left"] == 1 and said["bytes"] > 0
    assert sorted(os.listdir(copy)) == sorted([".gitignore", TAG, "README.md", MARKER, "notes.txt"])
    assert summarize_store(str(copy)).records == 0

    assert_one_line_error(
        run_cli("cache", "prune", "--older-than", "7x", "--cache", str(copy), env=ON), "--older-than '7x'", "7d"
    )


# -- bisect through the store ------------------------------------------------------------------------


def test_a_second_bisect_is_served_from_the_store_and_runs_no_cell(tmp_path):
    store = tmp_path / "store"
    args = ("bisect", "-s", "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off")
    args += ("-r", "26651:fixture,26738:glue-constant", "--device", "cpu", "--cache", str(store))

    def bisect(name: str) -> dict:
        r = run_cli(*args, "--json", str(tmp_path / name), env=ON, timeout=600)
        assert r.code == 1, r.out[-2000:] + r.err[-2000:]  # a culprit found
        return json.loads((tmp_path / name).read_text())

    first = bisect("1.json")
    assert first["store"] == {"path": str(store), "served": 0, "ran": first["cells"]} and first["cells"] > 1
    second = bisect("2.json")
    assert second["store"] == {"path": str(store), "served": first["cells"], "ran": 0}
    for key in ("culprits", "masking", "groups", "runs", "sets_run", "cells"):
        assert second[key] == first[key], key
    assert [c["ids"] for c in second["culprits"]] == [["26651:fixture"]]
    assert_one_line_error(run_cli(*args, "--no-cache", env=ON), "--cache DIR", "--no-cache")
