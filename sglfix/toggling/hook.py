"""The engine's revert variable (``envs.REVERT_PR``) in every Python process of an engine, with no program change.

Installing sglfix installs ``zz-sglfix-startup.pth``. Its one line checks the variable itself: unset,
empty or ``0``, it imports nothing and returns. Otherwise it calls ``boot()``, which

- validates the value against the profile's toggles (``SGLFIX_PROFILE``; ``SGLFIX_TOGGLES_DIR``):
  a bad value is one line on stderr naming the variable and exit 2, before the program runs.
  With ``SGLFIX_PROFILE`` unset, the profile follows what the process imports: an installed
  engine of a version a profile's range covers (real ``sglang``), or the reproduction
  (``sglfix.backends``); while neither is imported the value is checked against both and the
  first import decides (``sglfix.toggling.profiles.resolve_profile``). An id only another
  profile has is one line naming ``SGLFIX_PROFILE``;
- reverts at once what is already imported, and puts a finder first on ``sys.meta_path`` that
  reverts each remaining target right after its module has been executed: a function cannot
  run before its module is imported, so this is the same as reverting everything up front,
  without importing anything the program does not import;
- when an engine reads the variable too (real sglang's ``maybe_revert_pr_fix``, bound by name
  into the scheduler), replaces that reader's code with a no-op under every profile, so it
  neither applies its own reverts again nor chokes on a comma list or an id it lacks.

A revert that does not apply when its module arrives is also one line and exit 2: a production
run is never silently left unpatched. ``sglfix.reverted_ids()`` lists the parts applied in
full; ``SGLFIX_VERBOSE=1`` logs a line per applied revert. sglfix's own command line reads the
variable itself (it hands the selection to each cell's worker), so the hook stands down there.
"""

from __future__ import annotations

import _thread  # threading costs every set process a few ms; the hook needs a lock and a local
import os
import sys

from sglfix.common.environ import envs
from sglfix.toggling import ENV_VAR, selects_nothing

# typing costs every set process a few ms; the annotations are strings.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = ["VERBOSE_ENV", "arm", "armed", "boot", "disarm", "ensure_first", "settle"]

VERBOSE_ENV = envs.SGLFIX_VERBOSE.name
_LOCK = _thread.RLock()
_STATE: _EnvReverts | _Pending | None = None


def armed() -> _EnvReverts | None:
    """What the hook applies in this process (None when the variable selects nothing here, or
    while the profile waits for the process to import a code base)."""
    return _STATE if isinstance(_STATE, _EnvReverts) else None


def choice() -> Any:
    """The profile choice of this process (``sglfix.toggling.profiles.Choice``), once armed."""
    return getattr(_STATE, "choice", None)


def _log(message: str) -> None:
    if envs.SGLFIX_VERBOSE.get():
        sys.stderr.write(f"sglfix[{os.getpid()}]: {message}\n")
        sys.stderr.flush()


def _die(message: str) -> None:
    """One line on stderr and exit 2: never run on with a revert silently missing."""
    if envs.SGLFIX_DEBUG.get():
        import traceback

        traceback.print_exc()
    first = (message.splitlines() or [""])[0]
    # os._exit skips the interpreter's shutdown, so what the program already printed would be lost
    # with stdout piped (block-buffered): flush it first, so the output stops where the run did.
    try:
        sys.stdout.flush()
    except Exception:
        pass
    sys.stderr.write(f"sglfix: error: {first}\n")
    sys.stderr.flush()
    os._exit(2)


# The entry points that read the variable themselves: the command line and its workers.
_SELF_READING_MODULES = ("sglfix", "sglfix.execution.serve")


def _is_sglfix_cli() -> bool:
    """Is this process sglfix's own command line (or one of its workers)? Only those: a user's
    script that happens to be named ``sglfix``, or another ``sglfix.*`` module run with ``-m``,
    gets the reverts like any program."""
    argv = list(getattr(sys, "orig_argv", []) or [])
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1] in _SELF_READING_MODULES
    if sys.argv and os.path.basename(sys.argv[0]) in ("sglfix", "sglfix.exe"):
        return _is_console_script(sys.argv[0])
    return False


def _is_console_script(path: str) -> bool:
    """The ``sglfix`` script pip writes: a few lines that import the command line's ``main``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return b"from sglfix.cli import main" in head


def boot() -> None:
    """Called by ``zz-sglfix-startup.pth`` when the variable is set; exits 2 on any problem."""
    if _STATE is not None or _is_sglfix_cli():
        return
    try:
        arm(envs.REVERT_PR.get())
    except Exception as exc:
        from sglfix.common.errors import SglfixError

        _die(
            str(exc)
            if isinstance(exc, SglfixError)
            else f"{ENV_VAR} is set but sglfix could not arm it: {type(exc).__name__}: {exc}"
        )


def arm(value: str | None) -> _EnvReverts | None:
    """Validate ``value`` and revert what it selects in this process, now and on later imports.

    Raises ConfigError on a bad value (nothing armed then). Arming the same value again is a
    no-op; another value while one is armed is an error.
    """
    global _STATE
    from sglfix.common.errors import ConfigError
    from sglfix.toggling.profiles import resolve_profile

    with _LOCK:
        if _STATE is not None:
            if _STATE.value == (value or "").strip():
                return armed()
            raise ConfigError(f"{ENV_VAR}={value!r}, but {_STATE.value!r} is already applied in this process")
        if selects_nothing(value) and not _apply_value():
            return None
        value = value or ""
        chosen = resolve_profile(follow_imports=True)
        if chosen.profile is None:
            # Checked now against every candidate, so a bad value still stops the process at start.
            errors = [_selections(value, p, chosen) for _, p in chosen.candidates]
            if all(isinstance(e, Exception) for e in errors):
                raise errors[0]
            pending = _Pending(value=value.strip(), choice=chosen)
            _STATE = pending
            sys.meta_path.insert(0, _Decider(pending))
            return None
        return _arm_with(value.strip(), chosen)


class _Light:
    """A selected part as the content-keyed cache knows it (``armcache``): its id and the
    functions it reverts; its patches are read the full way when the first target arrives."""

    def __init__(self, pid: str, targets: tuple[str, ...]) -> None:
        self.id = pid
        self.targets = targets


def _apply_value() -> str:
    return (envs.SGLFIX_APPLY.get() or "").strip()


def _selections(value: str, profile: Any, chosen: Any) -> Any:
    """The selections ``value`` makes in ``profile``, after the candidate fixes ``SGLFIX_APPLY``
    names (checked against the profile's code base), or the ConfigError to raise: an id another
    profile has names ``SGLFIX_PROFILE`` (sglang's own ids are not all in every profile). From
    the cache (``_Light`` items) when it holds the answer and no fix is applied."""
    apply = _apply_value()
    if apply:
        from sglfix.common.errors import ConfigError
        from sglfix.toggling.candidate import from_env

        try:
            fixes = from_env(apply, codebase=profile)
        except ConfigError as exc:
            return exc
        if selects_nothing(value):
            return fixes
        reverts = _reverts(value, profile, chosen, cache=False)
        return reverts if isinstance(reverts, Exception) else [*fixes, *reverts]
    return _reverts(value, profile, chosen)


def _reverts(value: str, profile: Any, chosen: Any, *, cache: bool = True) -> Any:
    from sglfix.toggling import armcache

    toggles = _toggles_dir(profile)
    light = armcache.lookup(value, toggles) if cache else None
    if light is not None:
        return [_Light(pid, targets) for pid, targets in light]
    from sglfix.common.errors import ConfigError
    from sglfix.toggling.envvalue import parse_env_value
    from sglfix.toggling.profiles import PROFILE_ENV, PROFILES
    from sglfix.toggling.registry import load_registry

    try:
        registry = load_registry(toggles)
        selections = parse_env_value(value, registry=registry)
        armcache.store(toggles, registry)
        return selections
    except ConfigError as exc:
        for other in PROFILES.values():
            if other is profile:
                continue
            try:
                parse_env_value(value, registry=load_registry(other.toggles_dir))
            except ConfigError:
                continue
            return ConfigError(
                f"{ENV_VAR}={value}: not all of it is in profile {profile.name} ({chosen.why}); "
                f"profile {other.name} has it: set {PROFILE_ENV}={other.name}"
            )
        return exc


def _toggles_dir(profile: Any) -> str:
    return envs.SGLFIX_TOGGLES_DIR.get() or profile.toggles_dir


def _arm_with(value: str, chosen: Any) -> _EnvReverts:
    global _STATE
    selections = _selections(value, chosen.profile, chosen)
    if isinstance(selections, Exception):
        raise selections
    state = _EnvReverts(
        value=value, profile=chosen.profile, selections=selections, toggles_dir=_toggles_dir(chosen.profile)
    )
    state.choice = chosen
    _STATE = state
    sys.meta_path.insert(0, _Finder(state))
    _log(f"profile {chosen.profile.name}: {chosen.why}")
    state.apply_ready()
    return state


class _Pending:
    """The variable is valid, and the profile waits for the first import of a code base."""

    def __init__(self, *, value: str, choice: Any) -> None:
        self.value = value
        self.choice = choice

    def decide(self, module: str | None) -> _EnvReverts:
        """Arm with the profile that importing ``module`` selects (None: an explicit call before
        any code base was imported, which takes the installed engine's profile)."""
        from sglfix.toggling.profiles import Choice

        pick = next((p for m, p in self.choice.candidates if m == module), self.choice.candidates[0][1])
        why = (
            f"{self.choice.why.split(':')[0]} and this process imported {module} first"
            if module
            else f"{self.choice.why.split(':')[0]} and maybe_revert_pr_fix() was called before any code base "
            f"was imported: the installed engine's"
        )
        return _arm_with(self.value, Choice(pick, why))


class _Decider:  # a meta path finder (importlib.abc is not imported: it costs every process)
    """Finds nothing itself: the first import of a candidate code base arms its profile, then the
    armed finder handles that very import (so its targets are reverted as it arrives)."""

    def __init__(self, pending: _Pending) -> None:
        self.pending = pending
        self.modules = {m for m, _ in pending.choice.candidates}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.modules:
            return None
        global _STATE
        with _LOCK:
            if _STATE is not self.pending:
                return None
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            try:
                state = self.pending.decide(fullname)
            except Exception as exc:
                from sglfix.common.errors import SglfixError

                _STATE = None
                _die(
                    str(exc)
                    if isinstance(exc, SglfixError)
                    else f"{ENV_VAR}: choosing the profile on importing {fullname} failed: {type(exc).__name__}: {exc}"
                )
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) and finder.state is state:
                return finder.find_spec(fullname, path, target)
        return None

    def invalidate_caches(self) -> None:
        return None


def decide_now() -> _EnvReverts | None:
    """Arm a pending choice at once (an explicit ``maybe_revert_pr_fix()`` call)."""
    with _LOCK:
        if not isinstance(_STATE, _Pending):
            return armed()
        sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _Decider) and f.pending is _STATE)]
        from sglfix.toggling.profiles import resolve_profile

        now = resolve_profile(follow_imports=True)  # a code base may have been imported under another name meanwhile
        return _arm_with(_STATE.value, now) if now.profile is not None else _STATE.decide(None)


def ensure_first() -> None:
    """Put the hook's finders back in front of ``sys.meta_path``. Another import hook inserted
    later (pytest's assertion rewriter, for one: on a regular install it claims every ``sglfix``
    module, since sglfix ships a pytest plugin) would otherwise load a target module with its
    own loader, past the revert."""
    with _LOCK:
        ours = [f for f in sys.meta_path if isinstance(f, (_Finder, _Decider))]
        if ours and sys.meta_path[: len(ours)] != ours:
            sys.meta_path[:] = ours + [f for f in sys.meta_path if f not in ours]


def settle(*, module: str | None = None) -> None:
    """The last line of defence: install every waiting target whose module is imported by now,
    whichever finder or loader imported it (a function's code is swapped in place, so names
    bound earlier see the revert too); a target whose module is imported (and done executing)
    but still cannot be reverted raises ConfigError. ``module``: check only that module's
    targets (it has just been executed). Nothing is imported."""
    state = armed()
    if state is None:
        return
    state.apply_ready()
    from sglfix.common.errors import ConfigError

    for target, items in state.pending.items():
        found = _imported_module_of(target, executed=module)
        if found is not None and (module is None or found == module):
            names = _said(items)
            raise ConfigError(
                f"{ENV_VAR}: {names} is not in effect: {found} is imported but {target} is not there to revert"
            )


def _said(items: list) -> str:
    """``revert 26651,27460:sizing`` or ``apply +fix and revert 26651``: the labels of a target's specs."""
    by: dict[str, list[str]] = {}
    for _, label in items:
        verb, _, pid = label.partition(" ")
        if pid not in by.setdefault(verb, []):
            by[verb].append(pid)
    return " and ".join(f"{verb} {','.join(ids)}" for verb, ids in by.items())


def _imported_module_of(target: str, *, executed: str | None = None) -> str | None:
    """The imported plain module ``target`` must live in, or None while it may still be in a
    submodule that is not imported yet (the longest imported prefix is a package)."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        module = sys.modules.get(name)
        if module is not None:
            running = name != executed and getattr(getattr(module, "__spec__", None), "_initializing", False)
            if hasattr(module, "__path__") or running:
                return None  # a package (the target may be in a submodule) or still executing
            return name
    return None


def disarm() -> None:
    """Restore what the hook reverted and stop watching imports (a pytest session's end)."""
    global _STATE
    with _LOCK:
        state, _STATE = _STATE, None
        if isinstance(state, _Pending):
            sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _Decider) and f.pending is state)]
            return
        if state is None:
            return
        sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _Finder) and f.state is state)]
        if state._record is None and not state.done:
            return  # nothing was ever installed (and the patches were never read)
        from sglfix.toggling import revert as revert_mod

        for sel in state.selections:
            revert_mod.register_reverted(sel.id, state.record, replace=False)  # restore() drops every id it holds
        state.record.restore()


def _specs_by_target(selections: list) -> dict[str, list[tuple[Any, str]]]:
    """Each target's patch specs with their labels, in selection order: two parts on one
    function stack."""
    out: dict[str, list[tuple[Any, str]]] = {}
    for sel in selections:
        for spec in sel.part.patches:
            out.setdefault(spec.target, []).append((spec, f"{getattr(sel, 'verb', 'revert')} {sel.id}"))
    return out


class _EnvReverts:
    """The selected parts, the targets still waiting for their module, and what is installed."""

    def __init__(self, *, value: str, profile: Any, selections: list, toggles_dir: str | None = None) -> None:
        self.value = value
        self.profile = profile
        self.toggles_dir = toggles_dir
        self._selections = selections
        self._record: Any = None
        # target -> [(spec, label)] in selection order: two parts on one function stack. A spec
        # is None while the selections are the cache's (_Light): read on the first install.
        self.pending: dict[str, list[tuple[Any, str]]] = {}
        self.part_targets: dict[str, set[str]] = {}
        for sel in selections:
            if isinstance(sel, _Light):
                self.part_targets[sel.id] = set(sel.targets)
                for target in sel.targets:
                    self.pending.setdefault(target, []).append((None, f"revert {sel.id}"))
            else:
                self.part_targets[sel.id] = set(sel.part.targets)
        if not any(isinstance(sel, _Light) for sel in selections):
            self.pending = _specs_by_target(selections)
        # Every engine's own reader, whatever the profile: while sglfix applies the variable, an
        # engine must neither re-apply its reverts nor choke on an id it does not register.
        from sglfix.toggling.profiles import PROFILES

        self.engine_toggles = sorted({p.engine_toggle for p in PROFILES.values() if p.engine_toggle})
        self.choice: Any = None
        self.done: set[str] = set()
        self.watched = {
            ".".join(t.split(".")[:n])
            for t in [*self.pending, *self.engine_toggles]
            for n in range(1, t.count(".") + 1)
        }

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self._selections]

    @property
    def selections(self) -> list:
        self._materialize()
        return self._selections

    @property
    def record(self) -> Any:
        """The ``Reverted`` of this process's parts (made on first use: it needs the patches)."""
        if self._record is None:
            from sglfix.toggling.revert import Reverted

            self._materialize()
            self._record = Reverted(selections=list(self._selections))
        return self._record

    def _materialize(self) -> None:
        """Replace the cache's selections by the registry's own, and fill in the waiting specs."""
        if not any(isinstance(s, _Light) for s in self._selections):
            return
        from sglfix.toggling.envvalue import parse_env_value
        from sglfix.toggling.registry import load_registry

        full = parse_env_value(self.value, registry=load_registry(self.toggles_dir))
        if [s.id for s in full] != [s.id for s in self._selections]:
            raise RuntimeError(f"{ENV_VAR}={self.value}: the toggle files changed while the process ran")
        specs = _specs_by_target(full)
        for target in self.pending:
            self.pending[target] = specs[target]
        self._selections = full

    def applied_ids(self) -> list[str]:
        return [pid for pid, targets in self.part_targets.items() if targets <= self.done]

    # -- applying ------------------------------------------------------------------------------

    def apply_ready(self) -> None:
        """Install every waiting target whose function exists now, importing nothing."""
        with _LOCK:
            for target in [t for t in self.pending if _loaded_function(t) is not None]:
                self._install(target)
            for reader in self.engine_toggles:
                if _loaded_function(reader) is not None:
                    self._silence_engine_toggle(reader)

    def apply_all(self, *, allowed_prefixes: Any = None) -> None:
        """Import and install every waiting target now (an explicit ``maybe_revert_pr_fix()``)."""
        with _LOCK:
            for target in list(self.pending):
                self._install(target, allowed_prefixes=allowed_prefixes)

    def _install(self, target: str, *, allowed_prefixes: Any = None) -> None:
        from sglfix.common.errors import SglfixError
        from sglfix.patching.patcher import install_prepared, prepare_specs
        from sglfix.toggling import revert as revert_mod

        if target in self.pending:
            self._materialize()
        # Taken off the list first: preparing may import the module, whose arrival must not
        # install the same target a second time underneath this call.
        items = self.pending.pop(target, None)
        if items is None:
            return
        names = _said(items)
        try:
            prepared = prepare_specs(
                [s for s, _ in items], labels=[lab for _, lab in items], allowed_prefixes=allowed_prefixes
            )
            states = install_prepared(prepared)
        except SglfixError as exc:
            self.pending[target] = items
            raise type(exc)(f"{ENV_VAR}: {names} cannot be applied to {target}: {exc}") from exc
        self.record.states.extend(states)
        self.done.add(target)
        for sel in self._selections:
            if target in self.part_targets[sel.id] and self.part_targets[sel.id] <= self.done:
                revert_mod.register_reverted(sel.id, self.record)
                done = "applied" if getattr(sel, "verb", "revert") == "apply" else "reverted"
                _log(f"{done} {sel.id} ({', '.join(sorted(self.part_targets[sel.id]))})")

    def _silence_engine_toggle(self, reader: str) -> None:
        fn = _loaded_function(reader)
        if fn is None or getattr(fn, "__sglfix_silenced__", False):
            return
        namespace: dict[str, Any] = {}
        exec(
            compile(
                f"def {fn.__name__}(*args, **kwargs):\n"
                f"    '''{ENV_VAR} is applied by sglfix in this process (profile {self.profile.name}).'''\n"
                "    return None\n",
                f"<sglfix: {reader} silenced>",
                "exec",
            ),
            namespace,
        )
        fn.__code__ = namespace[fn.__name__].__code__.replace(co_qualname=fn.__code__.co_qualname)
        fn.__sglfix_silenced__ = True
        _log(f"{reader} silenced: sglfix applies {ENV_VAR}={self.value}")

    def module_loaded(self, name: str) -> None:
        try:
            self.apply_ready()
            settle(module=name)  # a target of a module that arrived without it is an error, not a wait
        except Exception as exc:
            from sglfix.common.errors import SglfixError

            _die(
                str(exc)
                if isinstance(exc, SglfixError)
                else f"{ENV_VAR}: applying the reverts after importing {name} failed: {type(exc).__name__}: {exc}"
            )


def _loaded_function(target: str) -> Any:
    """The function ``target`` names if its module is imported and defines it; imports nothing."""
    from inspect import getattr_static

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj = sys.modules.get(".".join(parts[:cut]))
        if obj is None:
            continue
        for name in parts[cut:]:
            try:
                obj = getattr_static(obj, name)
            except AttributeError:
                return None
        return obj if callable(obj) or isinstance(obj, (staticmethod, classmethod, property)) else None
    return None


class _Finder:  # a meta path finder, duck-typed like _Decider
    """Finds nothing itself: for a watched module it wraps the loader another finder returns."""

    def __init__(self, state: _EnvReverts) -> None:
        self.state = state
        self._busy = _thread._local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.state.watched or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.name = None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            # A loader by what it does (the hook keeps its imports few), not by class.
            spec.loader = _ThenRevert(spec.loader, self.state)  # type: ignore[assignment]
        return spec

    def invalidate_caches(self) -> None:
        return None


class _ThenRevert:
    """Runs the module with its own loader, then installs the reverts that can go in now and
    puts the own loader back on the spec and module (resources, reload and source lookups)."""

    def __init__(self, loader: Any, state: _EnvReverts) -> None:
        self._loader = loader
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
        self._state.module_loaded(module.__name__)
