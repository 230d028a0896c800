"""When sglfix's own driving code does not fit the code base it drives: sglfix's failure, not a
crash of the code under test.

A probe or an adapter (and the kit helpers they use) is written against one version of the
engine's interfaces. Run on a tree whose interfaces moved (a module or function renamed, a field
added to what a function reads), it fails in one of a few ways, none of which says anything about
the code under test: an import of the engine that names what this tree does not have; sglfix's
code reading an attribute the engine's module or object does not have; a call with arguments the
engine's function does not take; or the engine reading a field of an object sglfix built in place
of one of its own (a ``Standin``) that the stand-in does not carry. ``misfit`` recognises these
from the exception and its frames; the cell makes it an ERROR saying "this probe (adapter) does
not support this code base", never a CRASH blamed on the engine.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from types import ModuleType, SimpleNamespace
from typing import Any

from sglfix.common.codebase import active_package, is_code_under_test, under

__all__ = ["PASSTHROUGH", "Standin", "innermost_owner", "misfit"]


class Standin(SimpleNamespace):
    """An object sglfix builds in place of one of the engine's (a request, a batch view, a model
    runner), meant to carry every field the engine reads: one it lacks is sglfix's misfit, not
    the engine's bug. (A stand-in that leaves a field out on purpose, to see whether the engine
    copes without it, is a class of its own: the engine reading it there is the engine's CRASH.)"""


_SGLFIX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The allocation factories' wrapper (sglfix.harness.poison) sits between the code under test and
# torch: an error raised there (``torch.empty(None)``) is its caller's.
_POISON_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "poison.py")
# The CPU stand-ins for Triton's launcher (the interpreter's set-up and its launch memo): where a
# kernel launch fails inside Triton itself (a None where a tensor is wanted), the launch is the
# code under test's, as on a GPU, where no frame of sglfix sits between it and Triton.
# The local a wrapper of sglfix's that stands between the code under test and a library (a torch
# function mode, Triton's launch tracer) sets just before it forwards the call: an error from
# there on is the caller's, while one its own code raised before that stays sglfix's.
PASSTHROUGH = "__sglfix_passthrough__"
_LAUNCH_FILES = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name) for name in ("interpreter.py", "tritonkey.py")
)
# sglfix's torch stand-ins of FlashInfer's wrappers (sglfix.harness.torchfi) and of FlashMLA's
# kernel (sglfix.harness.flashmla) are the kernel library where the real one cannot run: what they
# refuse or fail on is the caller's, as the real library's own refusals are on a GPU.
_LIBRARY_DIRS = (
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchfi") + os.sep,
    # FlashMLA's stand-in (its kernel and scheduler), likewise.
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "flashmla.py"),
)


def innermost_owner(exc: BaseException, *, package: str | None = None) -> str | None:
    """Who owns the innermost frame that is not a library's: "code" (the code under test),
    "sglfix", or None (only library frames). Library frames (torch, triton) are skipped, and so
    are sglfix's wrappers that were forwarding the call when it failed (``PASSTHROUGH``)."""
    frames: list[tuple[str, bool]] = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, bool(tb.tb_frame.f_locals.get(PASSTHROUGH))))
        tb = tb.tb_next
    # Raised inside a library (not by sglfix's launch stand-in itself): the stand-in is passed through.
    in_library = bool(frames) and not os.path.abspath(frames[-1][0]).startswith(_SGLFIX_DIR)
    for filename, forwarding in reversed(frames):
        if is_code_under_test(filename, package=package):
            return "code"
        if forwarding or filename == _POISON_FILE or (in_library and os.path.abspath(filename) in _LAUNCH_FILES):
            continue
        if os.path.abspath(filename).startswith(_LIBRARY_DIRS):
            in_library = True
            continue
        if os.path.abspath(filename).startswith(_SGLFIX_DIR):
            return "sglfix"
    return None


def _in_package(obj: Any, package: str) -> str | None:
    """The dotted name of ``obj`` when it (or its type) belongs to the code base's package."""
    if isinstance(obj, ModuleType):
        return obj.__name__ if under(obj.__name__, package) else None
    kind = obj if isinstance(obj, type) else type(obj)
    module = getattr(kind, "__module__", "") or ""
    if under(module, package):
        return f"{module}.{kind.__qualname__}" + ("" if isinstance(obj, type) else " object")
    return None


def _function_of(qualname: str, package: str) -> str | None:
    """``qualname`` (as a TypeError names the function called) when a loaded module of the code
    base defines it: the full dotted name."""
    for name, module in list(sys.modules.items()):
        if module is None or not under(name, package):
            continue
        obj: Any = module
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None and callable(obj) and getattr(obj, "__module__", name) == name:
            return f"{name}.{qualname}"
    return None


def misfit(exc: BaseException, *, package: str | None = None) -> str | None:
    """What of the code base sglfix's driving code does not fit, in words (None: not a misfit)."""
    package = package or active_package()
    owner = innermost_owner(exc, package=package)
    if isinstance(exc, ImportError) and owner == "sglfix":
        name = exc.name or ""
        if not under(name, package):
            return None
        missing = re.search(r"cannot import name '([^']+)'", str(exc))
        if missing:
            return f"{name} has no {missing.group(1)}"
        return f"no module {name}"
    if isinstance(exc, AttributeError):
        obj, attr = getattr(exc, "obj", None), getattr(exc, "name", None)
        if attr is None:
            return None
        if owner == "sglfix":
            where = _in_package(obj, package)
            return f"{where} has no attribute {attr}" if where else None
        if owner == "code" and isinstance(obj, Standin):
            frame = next(
                (f for f in reversed(traceback.extract_tb(exc.__traceback__)) if is_code_under_test(f.filename)),
                None,
            )
            at = f"{frame.name} ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else package
            return f"{at} reads .{attr} of sglfix's stand-in {type(obj).__name__}, which has none"
        return None
    if isinstance(exc, TypeError) and owner == "sglfix":
        m = re.match(
            r"([\w.]+)\(\) (got an unexpected keyword argument '\w+'|missing \d+ required[\w -]*argument|"
            r"takes (?:from )?\d+)",
            str(exc),
        )
        if m:
            fn = _function_of(m.group(1), package)
            if fn is not None:
                return f"{str(exc).splitlines()[0]} ({fn} of this tree)"
    return None
