"""Test setup: fixture modules importable, each test leaves nothing reverted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

ALLOW = ("patch_fixtures",)


@pytest.fixture(autouse=True)
def _nothing_left_patched():
    from sglfix.patching import patcher

    yield
    from sglfix.toggling.revert import restore_everything

    restore_everything()
    leaked = [fn.__qualname__ for fn in list(patcher._STACKS)]
    for stack in list(patcher._STACKS.values()):
        for state in reversed(stack):
            state.restore()
    assert not leaked, f"test left functions patched: {leaked}"


@pytest.fixture
def allow():
    return ALLOW


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
