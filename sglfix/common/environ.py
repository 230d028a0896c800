"""Every environment variable sglfix reads or writes, declared once: its name, its type, its
default and what it does.

Code reads and writes a variable only through its declaration here (``envs.SGLFIX_PROFILE.get()``,
``envs.REVERT_PR.set(...)``), and a message names it by ``envs.X.name``, so a name is
spelled in one place (tests/common/test_environ_home.py holds it). Values are read when asked for, never at
import: a worker gets its settings from the environment its parent gives it, and a test sets one
for a block with ``override``.

This module is a leaf that imports ``os`` alone: the start-up hook (``zz-sglfix-startup.pth``, in
every Python process an engine starts) reads it. That ``.pth`` line cannot import sglfix before
deciding whether to, so it spells the two names it checks itself (the test checks they are the
ones declared here).
"""

from __future__ import annotations

import os

# typing costs every process of an engine a few ms at start-up; the annotations are strings.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping, MutableMapping
    from typing import Any

__all__ = ["Envs", "Flag", "Name", "Number", "Path", "Text", "Var", "envs"]


class Var:
    """One variable: a field of ``Envs`` whose attribute name is the variable's name."""

    def __init__(self, default: Any, *, doc: str, name: str = "") -> None:
        self.name = name
        self.default = default
        self.doc = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def raw(self, *, env: Mapping[str, str] | None = None) -> str | None:
        """The value as set in ``env`` (default: this process's environment), None when unset."""
        return (os.environ if env is None else env).get(self.name)

    def is_set(self, *, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env=env) is not None

    def get(self, *, env: Mapping[str, str] | None = None) -> Any:
        """The value, of this variable's type; the default when unset."""
        raw = self.raw(env=env)
        return self.default if raw is None else self.parse(raw)

    def parse(self, raw: str) -> Any:
        return raw

    def text(self, value: Any) -> str:
        """``value`` as the variable's text."""
        return str(value)

    def set(self, value: Any, *, env: MutableMapping[str, str] | None = None) -> None:
        """Set it in ``env`` (default: this process's environment, and so every process it starts
        after); None unsets it."""
        target = os.environ if env is None else env
        if value is None:
            target.pop(self.name, None)
        else:
            target[self.name] = self.text(value)

    def unset(self, *, env: MutableMapping[str, str] | None = None) -> str | None:
        """Remove it from ``env`` (default: this process's environment); the value it had."""
        return (os.environ if env is None else env).pop(self.name, None)

    def override(self, value: Any) -> _Override:
        """``with envs.X.override(v):`` sets it (None: unsets it) for the block, then restores it."""
        return _Override(self, value)

    def __bool__(self) -> bool:
        # ``if envs.X:`` would always be true: the value is ``envs.X.get()``.
        raise TypeError(f"{self.name}: read the variable with .get(), not as a truth value")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, default={self.default!r})"


class _Override:
    # A class, not contextlib.contextmanager: contextlib is not loaded at start-up.
    def __init__(self, var: Var, value: Any) -> None:
        self.var = var
        self.value = value
        self.old: str | None = None

    def __enter__(self) -> Var:
        self.old = self.var.raw()
        self.var.set(self.value)
        return self.var

    def __exit__(self, *exc: object) -> None:
        if self.old is None:
            self.var.unset()
        else:
            os.environ[self.var.name] = self.old


class Text(Var):
    """A string, exactly as set (an empty one included)."""

    def get(self, *, env: Mapping[str, str] | None = None) -> str | None:
        return super().get(env=env)


class Path(Var):
    """A path as set; empty is the same as unset."""

    def get(self, *, env: Mapping[str, str] | None = None) -> str | None:
        return self.raw(env=env) or self.default


class Name(Var):
    """A word, surrounding blanks dropped; blank is the same as unset."""

    def get(self, *, env: Mapping[str, str] | None = None) -> str | None:
        return (self.raw(env=env) or "").strip() or self.default


class Flag(Var):
    """On or off. Set, it is on exactly when its text is one of ``on``; without ``on``, off when its
    text, blanks dropped, is one of ``off`` and on otherwise."""

    def __init__(
        self, default: bool, *, doc: str, off: tuple[str, ...] = (), on: tuple[str, ...] | None = None
    ) -> None:
        super().__init__(default, doc=doc)
        self.off = off
        self.on = on

    def get(self, *, env: Mapping[str, str] | None = None) -> bool:
        return bool(super().get(env=env))

    def parse(self, raw: str) -> bool:
        if self.on is not None:
            return raw in self.on
        return raw.strip() not in self.off

    def text(self, value: Any) -> str:
        return "1" if value else "0"


class Number(Var):
    """A number; a text that is none raises ValueError naming the variable."""

    def get(self, *, env: Mapping[str, str] | None = None) -> float:
        return float(super().get(env=env))

    def parse(self, raw: str) -> float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r} is not a number") from None


_OFF = ("0", "off", "false", "no")


class Envs:
    """The variables; ``envs``, the one instance, is what code reads them through."""

    # -- what is reverted and applied, in every process (the start-up hook reads these)
    # The engine's own switch: its name is the engine's, spelled here alone; code says REVERT_PR.
    REVERT_PR = Text(
        None,
        name="SGLANG_DEBUG_REVERT_PR",
        doc="Toggle ids or parts to revert in every process (comma list); unset, empty or 0: none.",
    )
    SGLFIX_APPLY = Text(
        None, doc="Candidate fix files (unified diffs, os.pathsep between them) applied before the reverts."
    )
    SGLFIX_PROFILE = Name(
        None,
        doc="The profile whose toggle set applies (reproduction or a profile folder's name); unset: the "
        "reproduction, or for the start-up hook the code base the process imports.",
    )
    SGLFIX_TOGGLES_DIR = Path(None, doc="A toggle files directory to use instead of the profile's.")
    SGLFIX_PROFILES_PATH = Text(None, doc="More folders holding profiles, os.pathsep between them.")
    SGLFIX_CODEBASE_VERSION = Name(
        None, doc="The version of an engine source tree that records none (--codebase-version sets it)."
    )
    SGLFIX_RELEASE = Name(None, doc="The release this process runs (--release sets it), for what reports say.")
    SGLFIX_VERBOSE = Flag(False, doc="The start-up hook logs a line per revert it applies.", off=("", "0"))
    SGLFIX_DEBUG = Flag(False, doc="1: an error shows its traceback too, as --debug does.", on=("1",))

    # -- where things are kept
    SGLFIX_CACHE = Path(None, doc="The folder of sglfix's caches (default ~/.cache/sglfix).")
    SGLFIX_CACHE_DIR = Path(None, doc="The folder of the start-up hook's cache of toggle directories.")
    SGLFIX_STORE = Path(
        None, doc="The result store's folder (default: results/ in the cache folder); 0, off, no or false: no store."
    )

    # -- the cells and their workers
    SGLFIX_JOBS = Text(
        None,
        doc="Worker processes where --jobs is not given (an integer, at least 1): e.g. 1 where other "
        "processes already use the cores, as a test suite on several processes does.",
    )
    SGLFIX_MEMORY_BUDGET = Text(
        None, doc="Refuse scenarios estimated to need more memory than this (e.g. 16G); unset: 8G."
    )
    SGLFIX_KERNEL_MEMO = Flag(
        True, doc="0, off, false or no: no memo of interpreted Triton kernels' results.", off=_OFF
    )
    SGLFIX_KERNEL_MEMO_MB = Number(256.0, doc="The size of each worker's kernel memo in MiB (0: off).")
    SGLFIX_WORKER = Text(None, doc="A worker's channel and settings (JSON); its parent sets it, the worker removes it.")
    SGLFIX_WORKER_MEMORY_GB = Text(
        None,
        doc="A CPU worker's address-space cap in GiB (0, off, no or none: no cap); unset: 80 % of the "
        "machine's memory shared by its cores, at least 4 GiB.",
    )
    SGLFIX_WORKER_PROFILE = Path(None, doc="A folder: every worker runs under cProfile, its stats written there.")
    SGLFIX_WORKER_TIMELINE = Path(None, doc="A folder: every worker logs when each request came and went there.")

    # -- the pytest plugin's --sglfix-check-fixes (doctor --caught-by sets them)
    SGLFIX_CHECK_CLAIMS = Text(None, doc="Claims from outside, JSON {nodeid: [ids]}.")
    SGLFIX_CHECK_REPORT = Path(None, doc="A file the claims' outcomes are written to, JSON {nodeid: [outcomes]}.")

    def declared(self) -> tuple[Var, ...]:
        """Every variable, in the order declared."""
        return tuple(v for v in type(self).__dict__.values() if isinstance(v, Var))


envs = Envs()
