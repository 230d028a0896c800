"""SIGTERM and Ctrl-C as exceptions, so that ``with`` blocks unwind: workers are stopped, a
report being written is either whole or absent (its temporary file removed), and the command
line ends with one line and its exit code (130 interrupted, 143 terminated)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "signals_raise"]


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
