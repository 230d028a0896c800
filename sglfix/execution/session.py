"""One worker's requests: switch toggle sets the way production does, run a cell, reply.

Each request names a toggle set; the session applies it the way production does (it sets
``REVERT_PR`` in its own environment and calls ``maybe_revert_pr_fix()``),
restoring the previous set first and checking that nothing of it stayed behind.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from sglfix.common.environ import envs
from sglfix.execution.settings import EVERY_FUNCTION
from sglfix.execution.snapshot import StateSnapshot
from sglfix.harness.result import CellResult

__all__ = ["Session", "device_lost", "first_line"]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def device_lost() -> str | None:
    """Why this process's CUDA context can run nothing more, or None. A sticky error stays with
    the context and every call returns it, the device-wide wait included; any other error was
    reported once, to the call that met it."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


def _scenario_from_json(data: dict):
    from sglfix.scenario import Scenario

    if hasattr(Scenario, "from_json"):
        return Scenario.from_json(data)
    from sglfix.scenario import ModelShape, SpecShape

    data = dict(data)
    data["model"] = ModelShape(**data["model"])
    data["spec"] = SpecShape(**data["spec"])
    for key in ("prefix_lens", "extend_lens", "accept_lens", "capture_bs"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return Scenario(**data)


def _frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    fr = frames[-1]
    return f"{os.path.basename(fr.filename)}:{fr.lineno} in {fr.name}"


class Session:
    """One worker's state between requests: the toggle set it holds and the clean snapshot."""

    def __init__(self, *, device: str, allowed_prefixes: tuple[str, ...] | None, candidates: Any = ()) -> None:
        from sglfix.codebases import active

        self.device = device
        self.allowed_prefixes = allowed_prefixes
        self.fixes = _Fixes(candidates)
        self.held = None  # the Reverted of the current set, if it reverts anything
        self.current: list[str] | None = None  # None: nothing applied yet, or the last apply failed
        self.clean = StateSnapshot(active().package)  # the code base this worker booted into
        from sglfix.common.codebase import package_dir
        from sglfix.execution.entered import NO_BOOT, booted
        from sglfix.execution.store.process import ProcessRecord, lru_caches, shared_classes

        held = list(self.clean.entries.values())  # what the code base's modules bind after the boot
        # Caches the boot left empty: emptied again before each recorded cell, as lazy state is.
        self._caches = [c for c in lru_caches(held) if c.cache_info().currsize == 0]
        # What this process ran, for the result store (``_deps``): made now, while the code base's
        # files are as the boot loaded them; None where the boot was not recorded (no store).
        boot, package = booted(), active().package
        self._record = None
        if boot is not NO_BOOT:
            shared = shared_classes(held, package)
            self._record = ProcessRecord(package=package, root=package_dir(package), boot=boot, shared=shared)
        if device == "cuda":
            from sglfix.harness.tracing import wrap_compiled_launches

            wrap_compiled_launches()  # a compiled kernel runs no Python frame: its file is noted

    def handle(self, request: dict) -> dict:
        """The reply to one request; never raises for a failure of a cell. On CUDA, a reply whose
        cell left this process's GPU context unusable (a sticky error: an illegal address, a
        device-side assert) says so (``lost``): every later cell here would fail the same way, so
        the worker ends after it, and under MPS the cell may not even be the one at fault
        (``sglfix.execution.mps``)."""
        rid = request.get("id")
        if request.get("idle"):
            return {"id": rid, "idle": self._idle()}
        reply = self._handle(rid, request)
        if self.device == "cuda" and "result" in reply:
            lost = device_lost()
            if lost is not None:
                reply["lost"] = lost
        return reply

    def _handle(self, rid: Any, request: dict) -> dict:
        toggles = [str(t) for t in request.get("toggles") or []]
        scenario_data = request.get("scenario") or {}
        name = str(scenario_data.get("name", "?"))
        try:
            scenario = _scenario_from_json(scenario_data)
        except Exception as exc:
            return self._error(
                rid, name, toggles, f"sglfix failed to read the scenario: {type(exc).__name__}: {first_line(exc)}", exc
            )
        switched = None
        if toggles != self.current:
            began = time.perf_counter()
            restart, error = self._switch(toggles)
            switched = round((time.perf_counter() - began) * 1000, 3)
            if restart:
                return {"id": rid, "restart": restart}
            if error and error.startswith(_UNAVAILABLE):
                if request.get("not_reached") is None:
                    return self._skip(rid, name, toggles, error[len(_UNAVAILABLE) :])
                error = None  # a cell that never runs the patched function is judged without it
            if error:
                return self._error(rid, name, toggles, error)
        try:
            from sglfix.harness import interpreter
            from sglfix.harness.cell import run_cell

            before = interpreter.stats()
            record = request.get("record")
            unreached = request.get("not_reached")
            deps = bool(request.get("deps"))
            if unreached is not None:
                from sglfix.harness.cell import not_reached_result

                result = not_reached_result(
                    name,
                    toggles,
                    device=self.device,
                    same_as=str(unreached["same_as"]),
                    targets=[str(t) for t in unreached["targets"]],
                )
            else:
                from contextlib import nullcontext

                from sglfix.harness.fingerprint import fingerprinting

                with fingerprinting() if request.get("fingerprint") else nullcontext() as fp:
                    if record is None and not deps:
                        result = run_cell(scenario, device=self.device, toggles=toggles)
                    else:
                        result = self._run_recording(scenario, toggles, [str(t) for t in record or ()], deps=deps)
                if fp is not None:  # asked for: present even empty (the store tells it from "not asked")
                    result.fingerprint = fp.to_json()
            if interpreter.installed():
                after = interpreter.stats()
                result.kernels = {k: after[k] - before[k] for k in ("launches", "hits")}
        except Exception as exc:  # run_cell itself failed: the harness, not the code under test
            return self._error(
                rid, name, toggles, f"sglfix failed: {type(exc).__name__}: {first_line(exc)} [{_frame(exc)}]", exc
            )
        result.revert_env = envs.REVERT_PR.get()
        if switched is not None:
            result.timings_ms["switch"] = switched  # restore, state check, apply: before the cell
        if self.device == "cuda":
            from sglfix.harness.allocator import trim_after_cell

            try:
                trim_after_cell()
            except Exception:  # a device the cell left broken: ``handle`` says so, this result stands
                pass
        return {"id": rid, "result": result.to_json()}

    def _idle(self) -> dict:
        """Nothing to run for a while: give the allocator's cached device memory back."""
        import gc

        gc.collect()
        if self.device != "cuda":
            return {"device_reserved_mib": None}
        import torch

        torch.cuda.empty_cache()
        return {"device_reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1)}

    def _run_recording(self, scenario: Any, toggles: list[str], record: list[str], *, deps: bool = False) -> Any:
        """The cell, and which of the ``record`` targets it entered (``sglfix.execution.entered``;
        ``reached`` stays None when that record is incomplete, so no cell is called unreached on
        it). Lazy module caches start empty, as in a fresh worker, so that first-use code paths run.
        With ``deps``, also what the result store keys the result on (``deps``; None when the
        record is incomplete, and then the result is not stored)."""
        from sglfix.execution.entered import record_run
        from sglfix.harness.cell import run_cell
        from sglfix.toggling.revert import target_code

        if record == [EVERY_FUNCTION]:
            return self._run_recording_all(scenario, toggles, deps=deps)
        if not record:
            # As for a baseline: code that fills lazy module state or a cache runs in this cell
            # again, so it is recorded for it too, not only for the cell that filled it first.
            self._reset_lazy()
            out = record_run(lambda: run_cell(scenario, device=self.device, toggles=toggles), ran=True, apart=True)
            out.value.deps = self._deps(out.ran, out.imported)
            return out.value
        codes: dict[Any, str] = {}
        unresolved = []
        for target in record:
            try:
                codes[target_code(target, allowed_prefixes=self.allowed_prefixes)] = target
            except Exception as exc:
                if _missing_dependency(exc):
                    continue  # its module cannot be imported in this process: nothing of it runs here
                unresolved.append(target)  # counted as entered: its cells run and show what is wrong
        self._reset_lazy()
        out = record_run(
            lambda: run_cell(scenario, device=self.device, toggles=toggles), codes=codes, ran=deps, apart=deps
        )
        result = out.value
        if out.entered is not None:
            result.reached = sorted({codes[c] for c in out.entered} | set(unresolved))
        if deps:
            result.deps = self._deps(out.ran, out.imported)
        return result

    def _reset_lazy(self) -> None:
        """Before a recorded cell: lazy module state unset and the caches the boot left empty
        emptied, as a fresh worker's first cell finds them."""
        self.clean.reset_lazy()
        for cache in self._caches:
            if cache.cache_info().currsize:
                cache.cache_clear()

    def _deps(self, ran: list | None, imported: list | None = None) -> dict | None:
        """What the result store keys this cell's result on: the functions of the code base this
        cell ran, those its process's boot ran and those earlier cells ran that can leave state
        behind (``sglfix.execution.store.process``); None when a record is incomplete."""
        if self._record is None:
            return None
        return self._record.cell(ran, imported)

    def _run_recording_all(self, scenario: Any, toggles: list[str], *, deps: bool = False) -> Any:
        """The cell, and every function of the code base it entered, with where each is defined
        (what a finding names, and the functions ``mutate`` may change: the code that ran, file
        and line in the installed tree); with ``deps``, what the result store keys it on."""
        from sglfix.codebases import active
        from sglfix.common.codebase import package_dir
        from sglfix.execution.entered import record_run
        from sglfix.harness.cell import run_cell

        self._reset_lazy()
        package = active().package
        root = package_dir(package) or ""
        # Defined in the code base's own files (an inherited enum or dataclass method is not).
        codes = {c: n for c, n in _functions_of(package).items() if root and c.co_filename.startswith(root)}
        out = record_run(
            lambda: run_cell(scenario, device=self.device, toggles=toggles), codes=codes, ran=deps, apart=deps
        )
        result, entered = out.value, out.entered
        if deps:
            result.deps = self._deps(out.ran, out.imported)
        if entered is not None:
            top = os.path.dirname(root)
            names = {codes[c]: _defined_at(c, top) for c in entered}
            result.reached = sorted(names)
            result.reached_at = dict(sorted(names.items()))
        return result

    def _switch(self, toggles: list[str]) -> tuple[str | None, str | None]:
        """Restore the held set, check nothing of it stayed behind, apply the next one.
        Returns (why this worker must be replaced, why the set cannot be applied)."""
        from sglfix.toggling.env import maybe_revert_pr_fix

        left = ",".join(self.current or []) or "baseline"  # the set this worker held
        if self.held is not None:
            held, self.held = self.held, None
            try:
                held.restore()
            except Exception as exc:
                return f"restoring {','.join(held.ids)} failed: {first_line(exc)}", None
        self.current = None
        self.clean.reset_lazy()
        changed = self.clean.changes()
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            return (
                f"after {left}, state of the code under test differs from the worker's start: "
                f"{', '.join(changed[:3])}{more}"
            ), None
        from sglfix.toggling.candidate import split_ids

        fixes, reverts = split_ids(toggles)
        envs.REVERT_PR.set(",".join(reverts) if reverts else "0")
        try:
            envs.SGLFIX_APPLY.set(self.fixes.paths(fixes))
            self.held = maybe_revert_pr_fix(allowed_prefixes=self.allowed_prefixes, expected=self.fixes.sha256)
        except Exception as exc:
            envs.REVERT_PR.set("0")
            envs.SGLFIX_APPLY.set("")
            lacking = _missing_dependency(exc)
            if lacking:
                return None, (
                    f"{_UNAVAILABLE}{_what(toggles)} cannot be applied on this machine: the module it "
                    f"patches needs {lacking}, which is not installed here"
                )
            return None, f"{_what(toggles)} failed: {first_line(exc)}"
        self.current = list(toggles)
        return None, None

    def _skip(self, rid: Any, name: str, toggles: list[str], message: str) -> dict:
        result = CellResult(scenario=name, toggles=toggles, device=self.device)
        result.add("SKIP", message)
        result.revert_env = envs.REVERT_PR.get()
        return {"id": rid, "result": result.finish().to_json()}

    def _error(self, rid: Any, name: str, toggles: list[str], message: str, exc: BaseException | None = None) -> dict:
        result = CellResult(scenario=name, toggles=toggles, device=self.device)
        data: dict[str, Any] = {}
        if exc is not None:
            data = {
                "type": type(exc).__name__,
                "frame": _frame(exc),
                "traceback": "".join(traceback.format_exception(exc))[-4000:],
            }
        result.add("ERROR", message, **data)
        result.revert_env = envs.REVERT_PR.get()
        return {"id": rid, "result": result.finish().to_json()}


_UNAVAILABLE = "unavailable: "


def _defined_at(code: Any, top: str) -> str:
    """``path:line`` of a function's code below ``top``; a patched function's code names its
    patch in a folder of its file name (``[sglfix revert 26651:clamp, ...]``): the file, then it."""
    import re

    path, note = code.co_filename, ""
    m = re.search(r"[/\\]\[sglfix ([^\],]*)[^\]]*\](?=[/\\])", path)
    if m:
        path, note = path[: m.start()] + path[m.end() :], f" (as patched: {m.group(1)})"
    return f"{os.path.relpath(path, top)}:{code.co_firstlineno}{note}"


def _functions_of(package: str) -> dict[Any, str]:
    """The code objects of every function and method defined in the imported modules of
    ``package`` (module-level and class-level; nested ones run inside them), by dotted name."""
    import inspect
    import sys

    out: dict[Any, str] = {}

    def add(fn: Any, name: str) -> None:
        fn = inspect.unwrap(fn) if callable(fn) else fn
        code = getattr(fn, "__code__", None)
        if code is not None and code not in out:
            out[code] = name

    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == package or mod_name.startswith(package + ".")):
            continue
        for attr, obj in list(vars(module).items()):
            if getattr(obj, "__module__", None) != mod_name:
                continue
            if inspect.isfunction(obj):
                add(obj, f"{mod_name}.{attr}")
            elif inspect.isclass(obj):
                for key, member in list(vars(obj).items()):
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    elif isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member):
                        add(member, f"{mod_name}.{obj.__qualname__}.{key}")
    return out


def _what(toggles: Any) -> str:
    """A set in the words of its failure: ``revert 26651``, ``apply +fix and revert 26651``."""
    from sglfix.toggling.candidate import split_ids

    fixes, reverts = split_ids(toggles)
    said = [f"apply {','.join(fixes)}"] if fixes else []
    said += [f"revert {','.join(reverts)}"] if reverts else []
    return " and ".join(said)


class _Fixes:
    """The candidate fixes this worker may apply, each written to a file of its own (named so
    that its id is the same) for ``SGLFIX_APPLY``, as a production process reads it."""

    def __init__(self, candidates: Any) -> None:
        self.sha256: dict[str, str] = {}
        self.files: dict[str, str] = {}
        self._dir: str | None = None
        for cid, text, sha in candidates:
            if self._dir is None:
                self._dir = _owned_folder("sglfix-apply-")
            path = os.path.join(self._dir, cid.lstrip("+") + ".patch")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            self.files[cid], self.sha256[cid] = path, sha

    def paths(self, ids: Any) -> str:
        missing = [i for i in ids if i not in self.files]
        if missing:
            raise ValueError(f"candidate fix {missing[0]} was not given to this worker")
        return os.pathsep.join(self.files[i] for i in ids)


def _owned_folder(prefix: str) -> str:
    """A temporary folder this worker holds (locked) for its life. A worker ends by SIGKILL to its
    group, which runs no exit handler: the folder outlives it, and the next worker to make one
    removes the folders whose holder is gone (``sweep_dead``)."""
    import atexit
    import contextlib
    import tempfile

    from sglfix.codebases.releases import owned_tempdir, sweep_dead

    sweep_dead(tempfile.gettempdir(), prefix=prefix)
    stack = contextlib.ExitStack()
    folder = str(stack.enter_context(owned_tempdir(tempfile.gettempdir(), prefix=prefix)))
    atexit.register(stack.close)
    return folder


def _missing_dependency(exc: BaseException) -> str | None:
    """The third-party module whose absence made a revert's target unimportable here (a CUDA
    library on a CPU box: 0.5.15's DeepSeek-V4 backend imports cutlass), else None: a module of
    the code base or of sglfix that is missing is a real failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            root = seen.name.split(".")[0]
            from sglfix.codebases import active

            if root not in ("sglfix", active().package):
                return seen.name
            return None
        seen = seen.__cause__ or seen.__context__
    return None
