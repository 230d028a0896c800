"""Which code is under test: the package toggles patch by default, and how to tell its modules
and its frames from sglfix's own (the judge must never be mistaken for the code it judges).

``sglfix.backends`` is the reproduction of the engine. Real ``sglang`` is patchable by default
too; it is the harness's code under test only in a process that replays through it (a worker
of a real-sglang profile: ``sglfix.codebases.activate``). Nothing here imports the backends: finding the package's directory imports only ``sglfix``.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Any

__all__ = [
    "CODE_UNDER_TEST",
    "DEFAULT_PATCHABLE",
    "ENGINE",
    "active_codebase",
    "active_package",
    "clear_package_dirs",
    "is_code_under_test",
    "package_dirs",
    "set_active",
    "under",
]

CODE_UNDER_TEST = "sglfix.backends"
ENGINE = "sglang"
DEFAULT_PATCHABLE: tuple[str, ...] = (CODE_UNDER_TEST, ENGINE)


# The one holder of what this process replays through: the code base record activated by
# ``sglfix.codebases.activate`` (None: the reproduction). Typed loosely because this leaf knows
# only that a record has a ``package``; ``sglfix.codebases.active()`` gives it its type.
_ACTIVE: Any = None


def set_active(codebase: Any) -> None:
    """Make ``codebase`` (a record with a ``package``) this process's code under test."""
    global _ACTIVE
    _ACTIVE = codebase


def active_codebase() -> Any:
    """The activated record, or None while the process replays through the reproduction."""
    return _ACTIVE


def active_package() -> str:
    return CODE_UNDER_TEST if _ACTIVE is None else _ACTIVE.package


def under(name: str, prefix: str) -> bool:
    """``name`` is the module ``prefix`` or one of its submodules (``sglangx`` is not ``sglang``)."""
    return name == prefix or name.startswith(prefix + ".")


def package_dir(package: str) -> str | None:
    """The (first) directory of an installed package, found without importing it (its parent
    packages are imported, as ``find_spec`` does); None when it is not importable as a package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=8)
def package_dirs(package: str) -> tuple[str, ...]:
    """Every directory ``package``'s modules load from, as given and resolved, each ending in a
    separator; found without importing it (its parents are), () when it is no package. Remembered until
    ``clear_package_dirs``."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    dirs: list[str] = []
    for location in spec.submodule_search_locations:
        for form in (os.path.abspath(location), os.path.realpath(location)):
            dirs.append(form.rstrip(os.sep) + os.sep)
    return tuple(dict.fromkeys(dirs))


def clear_package_dirs() -> None:
    """Forget where packages were found (``sys.path`` changed: a release put in front)."""
    package_dirs.cache_clear()


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith((".py", ".pyc"))


def is_code_under_test(filename_or_module: str, *, package: str | None = None) -> bool:
    """True for a module name under ``package`` or a file inside its directory; ``package``
    defaults to the code base this process replays through (``sglfix.codebases.active()``).

    A frame's ``co_filename`` ("/.../backends/srt/x.py", installed or from a checkout) and a
    frame's ``__name__`` ("sglfix.backends.srt.x") both work; "<string>" and friends are not.
    """
    if package is None:
        package = active_package()
    text = str(filename_or_module)
    if not text or text.startswith("<"):
        return False
    if not _looks_like_path(text):
        return under(text, package)
    path = os.path.abspath(text)
    return any(path.startswith(d) for d in package_dirs(package))
