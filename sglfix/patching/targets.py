"""Resolve a dotted patch target to the plain Python function whose code gets swapped.

Also the safety fence: only targets under allowed module prefixes are imported at all, and
the standard library's dangerous corners and the tool itself are never patchable.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sglfix.common.codebase import CODE_UNDER_TEST, DEFAULT_PATCHABLE, under
from sglfix.common.errors import TargetError
from sglfix.common.schema import nearest

__all__ = [
    "DEFAULT_ALLOWED_PREFIXES",
    "ResolvedTarget",
    "check_allowed",
    "effective_prefixes",
    "resolve_target",
    "split_module",
]

DEFAULT_ALLOWED_PREFIXES: tuple[str, ...] = DEFAULT_PATCHABLE
# Never patchable, whatever the allow list says: a toggle must not be a way to run code in
# the interpreter's plumbing or to change the tool that judges the result.
_DENIED_PREFIXES: tuple[str, ...] = (
    "os",
    "posix",
    "subprocess",
    "builtins",
    "sys",
    "importlib",
    "runpy",
    "shutil",
    "socket",
    "ctypes",
    "pickle",
    "marshal",
    "signal",
    "multiprocessing",
    "sglfix",
)
_DENY_EXCEPTIONS: tuple[str, ...] = (CODE_UNDER_TEST,)


def effective_prefixes(allowed_prefixes: Iterable[str] | None = None) -> tuple[str, ...]:
    """The module prefixes toggles may patch: the ones given, else the defaults."""
    return tuple(allowed_prefixes) if allowed_prefixes is not None else DEFAULT_ALLOWED_PREFIXES


def check_allowed(target: str, allowed_prefixes: Iterable[str] | None = None) -> None:
    allowed = effective_prefixes(allowed_prefixes)
    if any(under(target, p) for p in _DENIED_PREFIXES) and not any(under(target, p) for p in _DENY_EXCEPTIONS):
        raise TargetError(
            f"target {target!r} is in a protected module; toggles may patch only the system "
            f"under test ({', '.join(allowed)})"
        )
    if not any(under(target, p) for p in allowed):
        raise TargetError(
            f"target {target!r} is outside the allowed module prefixes ({', '.join(allowed)}); "
            "add its package with --allow-target PREFIX (or allowed_prefixes=...) if it is "
            "really code under test"
        )


@dataclass(frozen=True)
class ResolvedTarget:
    """The function to patch, and how it was reached (for messages and for doctor)."""

    name: str
    function: types.FunctionType
    kind: str  # function, method, staticmethod, classmethod, property getter, ... (wrapped)

    @property
    def filename(self) -> str:
        return self.function.__code__.co_filename


def split_module(target: str) -> tuple[types.ModuleType, list[str]]:
    """Import the longest importable module prefix; the rest is an attribute chain."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):  # already imported: no import machinery at all
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            # Only when the rest starts with one of its attributes: a submodule not imported
            # yet (``sglfix`` before ``sglfix.backends``) must go through the import below.
            if cut == len(parts) or hasattr(module, parts[cut]):
                return module, parts[cut:]
            break
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        if module_name in sys.modules:
            return sys.modules[module_name], parts[cut:]
        try:
            return importlib.import_module(module_name), parts[cut:]
        except ModuleNotFoundError as exc:
            # Only "this prefix is not a module" moves on; a module that exists but fails to
            # import on a missing dependency is a real problem to report.
            if exc.name is not None and not (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise TargetError(f"target {target!r}: importing {module_name} failed: {exc}") from exc
            continue
        except Exception as exc:  # the module exists but raised while importing
            raise TargetError(f"target {target!r}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
    raise TargetError(f"target {target!r}: no prefix of it is an importable module")


def _describe(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"a class ({obj.__qualname__}); name one of its methods"
    if inspect.ismodule(obj):
        return "a module; name a function in it"
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return "a builtin/C function: it has no Python source to edit"
    if isinstance(
        obj,
        (
            types.WrapperDescriptorType,
            types.MethodDescriptorType,
            types.MethodWrapperType,
            types.ClassMethodDescriptorType,
        ),
    ):
        return "a method implemented in C: it has no Python source to edit"
    cls = type(obj)
    if cls.__name__ in {"JITFunction", "InterpretedFunction", "Autotuner", "Heuristics"} and "triton" in cls.__module__:
        return "a @triton.jit kernel: kernels cannot be patched (yet); patch the Python launcher"
    if isinstance(obj, functools.partial):
        return "a functools.partial; name the function it wraps"
    if isinstance(obj, types.FunctionType) and obj.__name__ == "<lambda>":
        return "a lambda: it has no def to recompile; give it a name"
    return f"a {cls.__module__}.{cls.__qualname__} object, not a function"


def resolve_target(target: str, *, allowed_prefixes: Iterable[str] | None = None) -> ResolvedTarget:
    check_allowed(target, allowed_prefixes)
    obj, chain = split_module(target)
    kind = "function"
    walked = obj.__name__
    for name in chain:
        try:
            raw = inspect.getattr_static(obj, name)
        except AttributeError:
            options = [n for n in dir(obj) if not n.startswith("__")]
            raise TargetError(
                f"target {target!r}: {walked} has no attribute {name!r}{nearest(name, options)}"
            ) from None
        owner_is_class = inspect.isclass(obj)
        if isinstance(raw, staticmethod):
            obj, kind = raw.__func__, "staticmethod"
        elif isinstance(raw, classmethod):
            obj, kind = raw.__func__, "classmethod"
        elif isinstance(raw, property):
            if raw.fget is None:
                raise TargetError(f"target {target!r}: property {name!r} has no getter")
            obj, kind = raw.fget, "property getter"
        else:
            obj = raw
            kind = "method" if owner_is_class and isinstance(raw, types.FunctionType) else "function"
        walked = f"{walked}.{name}"
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, types.FunctionType) and hasattr(obj, "__wrapped__"):
        # Decorated with functools.wraps: the wrapper calls the wrapped function object,
        # so swapping the innermost function's code is what changes behaviour.
        inner = inspect.unwrap(obj)
        if isinstance(inner, types.FunctionType):
            obj, kind = inner, f"{kind} (wrapped)"
    if not isinstance(obj, types.FunctionType) or obj.__name__ == "<lambda>":
        raise TargetError(f"target {target!r} is {_describe(obj)}")
    return ResolvedTarget(name=target, function=obj, kind=kind)
