"""Failures sglfix meets in its own frames that are the code under test's: a cell's CRASH.

sglfix stands where the engine would in places: it calls the backend's factories as the engine's
workers do, and on CPU it runs the backend's Triton kernels in the interpreter. What the code
under test breaks there (a factory that builds nothing, a kernel that reaches past its tensors)
fails in sglfix's frames, yet it is the code's fault: these types say so to the cell
(``sglfix.harness.cell``), which reports them as CRASH, never as sglfix's ERROR.
"""

from __future__ import annotations

__all__ = ["BrokenContract", "CodeFault", "OutOfBounds", "code_fault_of"]


class CodeFault(Exception):
    """A failure of the code under test met in sglfix's frames."""


class BrokenContract(CodeFault):
    """The code under test handed back what none of its callers in the engine could use (no
    backend where a factory must build one, fewer step backends than draft steps)."""


class OutOfBounds(CodeFault):
    """An interpreted kernel loads or stores outside every tensor it was given: on a GPU an
    illegal address (or silent corruption), on CPU a read or write of the worker's own memory."""


def code_fault_of(exc: BaseException) -> CodeFault | None:
    """``exc`` or what it was raised from (the Triton interpreter wraps a kernel's error in its
    own), when that is a CodeFault."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, CodeFault):
            return at
        seen.add(id(at))
        at = at.__cause__
    return None
