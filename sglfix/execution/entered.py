"""Which of a few code objects a call enters: the reachability record of a baseline cell.

A cell proves a toggle unreachable only if this record is complete, so the recorder must see every
entry, from any thread, whatever else in the process profiles or traces. On Python 3.12+ it is a
``sys.monitoring`` tool of its own with ``PY_START`` events switched on for the target code objects
only (nothing else pays a callback; no other tool, profiler or ``sys.setprofile`` displaces it).
Before 3.12 it is the C profiler (a Python hook on every call costs too much under interpreted
kernels), which sees the calling thread only; when something replaced that profiler during the
call, the record is incomplete and the result says so (``None``): the caller then runs the cells
instead of calling them unreached.

The same call can also record every code object it ran (``ran``): what the result store keys a
cell's result on, function by function. On 3.12+ that is a second tool with ``PY_START`` on
everywhere, each code object switched off after its first entry (one callback per function per
call). Before 3.12 it is the same C profiler, paused while the Triton interpreter runs a kernel
(``sglfix.harness.tracing``, which names the kernel's code instead). ``record_boot`` keeps the
record of a worker's boot (the code its imports ran) and the top-level modules it looked for and
did not find, for the store's key of everything that process runs.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

__all__ = ["Recorded", "absent_modules", "record_boot", "record_entries", "record_run"]

_TOOL_NAME = "sglfix-reach"
_EVERY_TOOL_NAME = "sglfix-ran"


class Recorded(NamedTuple):
    """A recorded call: its value, the target codes it entered, every code object it ran and,
    kept apart when asked, every code object that ran under an import it made (each None when
    that record is incomplete, or was not asked for)."""

    value: Any
    entered: set | None
    ran: list | None
    imported: list | None = None


def record_entries(codes: Iterable[Any], call: Callable[[], Any]) -> tuple[Any, set | None]:
    """``(call(), the subset of codes entered)``; the set is ``None`` when the record is incomplete."""
    out = record_run(call, codes=codes)
    return out.value, out.entered


def record_run(
    call: Callable[[], Any], *, codes: Iterable[Any] = (), ran: bool = False, apart: bool = False
) -> Recorded:
    """``call()`` with the ``codes`` it entered and, with ``ran``, every code object whose Python
    code it ran (a launched Triton kernel's included: ``sglfix.harness.tracing``); with ``apart``
    as well, what ran under a module's import is listed apart (``imported``: once
    ``record_boot`` has set the import system up for it, else in ``ran``)."""
    targets = set(codes)
    if not targets and not ran:
        return Recorded(call(), set(), None)
    if sys.version_info >= (3, 12):
        return _monitored(targets, call, every=ran, apart=ran and apart)
    return _profiled(targets, call, every=ran, apart=ran and apart)


class _Absent:
    """A finder last on ``sys.meta_path`` that every other finder has failed: the top-level
    modules looked for and not found (an optional dependency that is not installed, whose absence
    a result may depend on: installing it must make that result miss)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if "." not in name:
            self.names.add(name)
        return None

    def invalidate_caches(self) -> None:
        pass


_ABSENT = _Absent()
_BOOT: list = []  # (the boot's Recorded.ran, ) once record_boot ran


def absent_modules() -> list[str] | None:
    """The top-level modules this process looked for and did not find since ``record_boot``
    (None: it was not called), those found later left out."""
    if _ABSENT not in sys.meta_path:
        return None
    return sorted(n for n in _ABSENT.names if sys.modules.get(n) is None)


def record_boot(call: Callable[[], Any], *, package: str) -> Any:
    """``call()`` (a worker importing its code under test, ``package``), recording every code
    object it ran and, from now on, the modules looked for and not found. ``booted()`` returns
    the record: None (incomplete) when a module of ``package`` was imported before the call."""
    from sglfix.harness.tracing import watch_imports

    if _ABSENT not in sys.meta_path:
        sys.meta_path.append(_ABSENT)
    watch_imports()  # a cell's imports are recorded apart from the rest of it (``record_run``)
    early = any(n == package or n.startswith(package + ".") for n in list(sys.modules))
    out = record_run(call, ran=True)
    _BOOT[:] = [None if early else out.ran]
    return out.value


def booted() -> Any:
    """The code objects the boot ran: a list, None when that record is incomplete, or
    ``NO_BOOT`` when the boot was not recorded."""
    return _BOOT[0] if _BOOT else NO_BOOT


NO_BOOT = object()


def _free_tool_ids(n: int) -> list[int]:
    mon = sys.monitoring  # type: ignore[attr-defined]  # Python 3.12's; reached only there (``entered``)
    # 2 is the profiler's, 1 and 0 debuggers' and coverage's by convention
    return [tool for tool in (4, 3, 5, 1, 0) if mon.get_tool(tool) is None][:n]


def _monitored(targets: set, call: Callable[[], Any], *, every: bool, apart: bool = False) -> Recorded:
    from sglfix.harness.tracing import Recorder, recording

    mon = sys.monitoring  # type: ignore[attr-defined]  # Python 3.12's; reached only there (``entered``)
    tools = _free_tool_ids(int(bool(targets)) + int(every))
    if len(tools) < int(bool(targets)) + int(every):  # six tools busy: the C profiler still works on 3.12
        return _profiled(targets, call, every=every, apart=apart)
    entered: set = set()
    # id -> code object (code compares by value, not identity); what ran under imports apart
    rec = Recorder({}, None, {} if apart else None)
    lock = threading.Lock()

    def on_start(code: Any, offset: int) -> Any:
        with lock:
            entered.add(code)
        return None  # never DISABLE: that would outlive this recorder for the next one on this id

    def on_any_start(code: Any, offset: int) -> Any:
        rec.target()[id(code)] = code
        return mon.DISABLE  # once per code object and call of this recorder: see restart_events below

    reach_tool = tools.pop(0) if targets else None
    every_tool = tools.pop(0) if every else None
    with contextlib.ExitStack() as stack:
        if reach_tool is not None:
            mon.use_tool_id(reach_tool, _TOOL_NAME)
            stack.callback(mon.free_tool_id, reach_tool)
            mon.register_callback(reach_tool, mon.events.PY_START, on_start)
            stack.callback(mon.register_callback, reach_tool, mon.events.PY_START, None)
            for code in targets:
                mon.set_local_events(reach_tool, code, mon.events.PY_START)
                stack.callback(mon.set_local_events, reach_tool, code, 0)
        if every_tool is not None:
            mon.use_tool_id(every_tool, _EVERY_TOOL_NAME)
            stack.callback(mon.free_tool_id, every_tool)
            mon.register_callback(every_tool, mon.events.PY_START, on_any_start)
            stack.callback(mon.register_callback, every_tool, mon.events.PY_START, None)
            # Code a former recorder saw was DISABLEd for it: switched on again, so that this
            # call's first entry into every code object is seen.
            mon.restart_events()
            mon.set_events(every_tool, mon.events.PY_START)
            stack.callback(mon.set_events, every_tool, 0)
            stack.enter_context(recording(rec))
        value = call()
    return Recorded(
        value,
        entered & targets if targets else set(),
        list(rec.ran.values()) if every else None,
        list(rec.imported.values()) if rec.imported is not None else None,
    )


def _profiled(targets: set, call: Callable[[], Any], *, every: bool, apart: bool = False) -> Recorded:
    import cProfile

    from sglfix.harness.tracing import Recorder, recording

    noted: dict[int, Any] = {}
    # Only Python functions matter; the builtins' and the callers' bookkeeping is cost alone.
    profiler = cProfile.Profile(builtins=False, subcalls=False)
    rec = Recorder(noted, profiler if every else None, {} if apart else None)
    with recording(rec):
        profiler.enable()
        displaced = False
        try:
            value = call()
        finally:
            # Before 3.12 the C profiler is the thread's profile hook: anything that set another one
            # during the call cut the record short.
            displaced = sys.version_info < (3, 12) and sys.getprofile() is not profiler
            profiler.disable()
    if displaced:
        return Recorded(value, None, None)
    stats = profiler.getstats()
    entered = {e.code for e in stats if e.code in targets} if targets else set()
    ran = None
    if every:
        noted.update((id(e.code), e.code) for e in stats if not isinstance(e.code, str))
        ran = list(noted.values())
    return Recorded(value, entered, ran, list(rec.imported.values()) if rec.imported is not None else None)
