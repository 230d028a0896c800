"""SIGTERM and Ctrl-C as exceptions, so that ``with`` blocks unwind: workers are stopped, a
report being written is either whole or absent (its temporary file removed), and the command
line ends with one line and its exit code (130 interrupted, 143 terminated)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "deferred", "signals_raise"]


class Terminated(BaseException):
    """SIGTERM arrived; raised (like KeyboardInterrupt for Ctrl-C) so that ``with`` blocks unwind."""

    exit_code = 143


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While active, SIGTERM raises ``Terminated`` and Ctrl-C raises ``KeyboardInterrupt``."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can be set from the main thread only
        return

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    old_term = signal.signal(signal.SIGTERM, on_term)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int in (signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
        if old_int in (signal.SIG_DFL, None):
            signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM noted, not acted on, until the block ends; then the first one noted is
    raised again, so that its own handler (or its default action) takes effect after the block.
    The block gets the list of those noted so far: a write that finds one abandons itself.

    Blocking the signals in this thread (``pthread_sigmask``) does not hold them: in a process with
    other threads the kernel hands the signal to one of those, and Python still runs the handler
    here, at whatever line this thread is on. Replacing the handlers holds them wherever the
    signal lands. Off the main thread no handler can interrupt this one: nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    noted: list[int] = []

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)

    old: dict[int, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, note)
        yield noted
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if noted:
            signal.raise_signal(noted[0])  # its handler runs now, as if it had just arrived
