"""Which of a few code objects a call enters: the reachability record of a baseline cell.

A cell proves a toggle unreachable only if this record is complete, so the recorder must see every
entry, from any thread, whatever else in the process profiles or traces. On Python 3.12+ it is a
``sys.monitoring`` tool of its own with ``PY_START`` events switched on for the target code objects
only (nothing else pays a callback; no other tool, profiler or ``sys.setprofile`` displaces it).
Before 3.12 it is the C profiler (a Python hook on every call costs too much under interpreted
kernels), which sees the calling thread only; when something replaced that profiler during the
call, the record is incomplete and the result says so (``None``): the caller then runs the cells
instead of calling them unreached.

The same call can also record every source file it ran code of (``files``): what the result store
keys a cell's result on. On 3.12+ that is a second tool with ``PY_START`` on everywhere, each code
object switched off after its first entry (one callback per function per call). Before 3.12 it is
the same C profiler, paused while the Triton interpreter runs a kernel (``sglfix.harness.tracing``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

__all__ = ["Recorded", "record_entries", "record_run"]

_TOOL_NAME = "sglfix-reach"
_FILES_TOOL_NAME = "sglfix-files"


class Recorded(NamedTuple):
    """A recorded call: its value, the target codes it entered and the source files it ran
    code of (each None when that record is incomplete, or was not asked for)."""

    value: Any
    entered: set | None
    files: set[str] | None


def record_entries(codes: Iterable[Any], call: Callable[[], Any]) -> tuple[Any, set | None]:
    """``(call(), the subset of codes entered)``; the set is ``None`` when the record is incomplete."""
    out = record_run(call, codes=codes)
    return out.value, out.entered


def record_run(call: Callable[[], Any], *, codes: Iterable[Any] = (), files: bool = False) -> Recorded:
    """``call()`` with the ``codes`` it entered and, with ``files``, every source file whose
    Python code it ran (a launched Triton kernel's file included: ``sglfix.harness.tracing``)."""
    targets = set(codes)
    if not targets and not files:
        return Recorded(call(), set(), None)
    if sys.version_info >= (3, 12):
        return _monitored(targets, call, files=files)
    return _profiled(targets, call, files=files)


def _free_tool_ids(n: int) -> list[int]:
    mon = sys.monitoring
    # 2 is the profiler's, 1 and 0 debuggers' and coverage's by convention
    return [tool for tool in (4, 3, 5, 1, 0) if mon.get_tool(tool) is None][:n]


def _monitored(targets: set, call: Callable[[], Any], *, files: bool) -> Recorded:
    from sglfix.harness.tracing import recording

    mon = sys.monitoring
    tools = _free_tool_ids(int(bool(targets)) + int(files))
    if len(tools) < int(bool(targets)) + int(files):  # six tools busy: the C profiler still works on 3.12
        return _profiled(targets, call, files=files)
    entered: set = set()
    ran: set[str] = set()
    lock = threading.Lock()

    def on_start(code: Any, offset: int) -> Any:
        with lock:
            entered.add(code)
        return None  # never DISABLE: that would outlive this recorder for the next one on this id

    def on_any_start(code: Any, offset: int) -> Any:
        ran.add(code.co_filename)
        return mon.DISABLE  # once per code object and call of this recorder: see restart_events below

    reach_tool = tools.pop(0) if targets else None
    files_tool = tools.pop(0) if files else None
    with contextlib.ExitStack() as stack:
        if reach_tool is not None:
            mon.use_tool_id(reach_tool, _TOOL_NAME)
            stack.callback(mon.free_tool_id, reach_tool)
            mon.register_callback(reach_tool, mon.events.PY_START, on_start)
            stack.callback(mon.register_callback, reach_tool, mon.events.PY_START, None)
            for code in targets:
                mon.set_local_events(reach_tool, code, mon.events.PY_START)
                stack.callback(mon.set_local_events, reach_tool, code, 0)
        if files_tool is not None:
            mon.use_tool_id(files_tool, _FILES_TOOL_NAME)
            stack.callback(mon.free_tool_id, files_tool)
            mon.register_callback(files_tool, mon.events.PY_START, on_any_start)
            stack.callback(mon.register_callback, files_tool, mon.events.PY_START, None)
            # Code a former recorder saw was DISABLEd for it: switched on again, so that this
            # call's first entry into every code object is seen.
            mon.restart_events()
            mon.set_events(files_tool, mon.events.PY_START)
            stack.callback(mon.set_events, files_tool, 0)
            stack.enter_context(recording(ran))
        value = call()
    return Recorded(value, entered & targets if targets else set(), ran if files else None)


def _profiled(targets: set, call: Callable[[], Any], *, files: bool) -> Recorded:
    import cProfile

    from sglfix.harness.tracing import recording

    noted: set[str] = set()
    # Only Python functions matter; the builtins' and the callers' bookkeeping is cost alone.
    profiler = cProfile.Profile(builtins=False, subcalls=False)
    with recording(noted, profiler if files else None):
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
    if files:
        ran = {e.code.co_filename for e in stats if not isinstance(e.code, str)} | noted
    return Recorded(value, entered, ran)
