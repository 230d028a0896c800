"""What several test files build the same way: the repository's root, the worker pool's test
cells and toggles, git repositories and their commits, and venvs that borrow this environment's
packages. Fixtures shared the same way are in conftest.py."""

from __future__ import annotations

from pathlib import Path

# The checkout these tests belong to, wherever in tests/ a file sits.
ROOT = Path(__file__).resolve().parent.parent
