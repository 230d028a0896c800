"""Which of a few code objects a call enters: the reachability record of a baseline cell.

A cell proves a toggle unreachable only if this record is complete, so the recorder must see every
entry, from any thread, whatever else in the process profiles or traces. On Python 3.12+ it is a
``sys.monitoring`` tool of its own with ``PY_START`` events switched on for the target code objects
only (nothing else pays a callback; no other tool, profiler or ``sys.setprofile`` displaces it).
Before 3.12 it is the C profiler (a Python hook on every call costs too much under interpreted
kernels), which sees the calling thread only; when something replaced that profiler during the
call, the record is incomplete and the result says so (``None``): the caller then runs the cells
instead of calling them unreached.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["record_entries"]

_TOOL_NAME = "sglfix-reach"


def record_entries(codes: Iterable[Any], call: Callable[[], Any]) -> tuple[Any, set | None]:
    """``(call(), the subset of codes entered)``; the set is ``None`` when the record is incomplete."""
    targets = set(codes)
    if not targets:
        return call(), set()
    if sys.version_info >= (3, 12):
        return _monitored(targets, call)
    return _profiled(targets, call)


def _free_tool_id() -> int | None:
    mon = sys.monitoring
    for tool in (4, 3, 5, 1, 0):  # 2 is the profiler's, 1 and 0 debuggers' and coverage's by convention
        if mon.get_tool(tool) is None:
            return tool
    return None


def _monitored(targets: set, call: Callable[[], Any]) -> tuple[Any, set | None]:
    mon = sys.monitoring
    tool = _free_tool_id()
    if tool is None:  # six tools busy: fall back, the C profiler still works on 3.12
        return _profiled(targets, call)
    entered: set = set()
    lock = threading.Lock()

    def on_start(code: Any, offset: int) -> Any:
        with lock:
            entered.add(code)
        return None  # never DISABLE: that would outlive this recorder for the next one on this id

    mon.use_tool_id(tool, _TOOL_NAME)
    try:
        mon.register_callback(tool, mon.events.PY_START, on_start)
        for code in targets:
            mon.set_local_events(tool, code, mon.events.PY_START)
        try:
            result = call()
        finally:
            for code in targets:
                mon.set_local_events(tool, code, 0)
            mon.register_callback(tool, mon.events.PY_START, None)
    finally:
        mon.free_tool_id(tool)
    return result, entered & targets


def _profiled(targets: set, call: Callable[[], Any]) -> tuple[Any, set | None]:
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    displaced = False
    try:
        result = call()
    finally:
        # Before 3.12 the C profiler is the thread's profile hook: anything that set another one
        # during the call cut the record short.
        displaced = sys.version_info < (3, 12) and sys.getprofile() is not profiler
        profiler.disable()
    if displaced:
        return result, None
    return result, {e.code for e in profiler.getstats() if e.code in targets}
