"""Test setup: fixture modules importable, each test leaves nothing reverted."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

# Tests run cells to see them run: the result store stays off unless a test names a folder
# (--cache DIR); tests/execution/store/test_store.py is about the store itself.
os.environ["SGLFIX_STORE"] = "0"
# One worker a run where the command line does not say (--jobs): the suite runs on several
# processes (pytest -n 3), so a run's second worker would add a boot and no speed. The tests of
# how workers are dealt give --jobs.
os.environ["SGLFIX_JOBS"] = "1"

ALLOW = ("patch_fixtures",)

# Each file timed against its budget in tests/budgets.json, the files run fast first; pytester
# for the tests of that plugin.
pytest_plugins = ("budgets", "pytester")


@pytest.hookimpl(wrapper=True)
def pytest_collection():
    # Collection makes millions of short-lived AST nodes (assertion rewriting) beside a heap that
    # holds torch: the cyclic collector's passes over that heap were a fifth of collection's time.
    # What collection leaves in cycles is collected once it is back on.
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()


@pytest.fixture(autouse=True)
def _nothing_left_patched():
    from sglfix.patching import state as patch_state

    yield
    from sglfix.toggling import hook, revert

    # What the session reverts (pytest --sglfix-revert) stays; anything a test left is undone.
    session = hook.armed()
    kept = {id(s) for s in session.record.states} if session is not None else set()
    for held in reversed(revert._held()):
        if session is None or held is not session.record:
            held.restore()
    leaked = [
        fn.__qualname__ for fn, stack in list(patch_state._STACKS.items()) if any(id(s) not in kept for s in stack)
    ]
    for stack in list(patch_state._STACKS.values()):
        for state in reversed(stack):
            if id(state) not in kept:
                state.restore()
    assert not leaked, f"test left functions patched: {leaked}"


@pytest.fixture
def allow():
    return ALLOW


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory):
    """``--cache DIR`` of a result store for the whole session, for CLI runs that may serve each
    other's cells (the same built-in cells under the same options): a cell is run once and its
    result served again, as between CI jobs. Only for a test whose point is what a command
    prints or writes from results, never for one of how cells run. (A named folder turns the
    store on where the suite's SGLFIX_STORE=0 keeps it off.) Under pytest-xdist every worker
    takes the same folder, as CI jobs share one (the store is one SQLite file in WAL mode)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-store"
    folder.mkdir(exist_ok=True)
    return ("--cache", str(folder))


@pytest.fixture
def toggles_dir(tmp_path, monkeypatch):
    """An empty toggles dir selected through the env, so CLI/env parsing sees only test toggles."""
    d = tmp_path / "toggles"
    d.mkdir()
    monkeypatch.setenv("SGLFIX_TOGGLES_DIR", str(d))
    from sglfix.toggling.registry import _load

    _load.cache_clear()
    yield d
    _load.cache_clear()
