"""Stand-ins for packages a CPU machine cannot install, so that real sglang imports there.

Real sglang imports ``sgl_kernel`` (CUDA-only wheel) and ``torchvision`` (PyPI's build does not
load beside a CPU torch) at module level in files the attention backends pull in, although none
of the CPU code paths calls them. A stand-in is a module whose every attribute is a stand-in
object: importing, ``from x import y``, subclassing and attribute chains work; **calling** one
raises ``StandInCalled``, so a kernel is never silently turned into a no-op: a cell that reaches
one is a CRASH naming the package.

A profile names the packages its code base needs stood in for (``Profile.standins``).
Installed only in a worker of a real-sglang run and only for a package that is missing
(``install`` checks ``find_spec`` first); ``used()`` lists those a process installed.

A capability query is not a kernel: where the code base carries its own implementation of the
same query (sglang's ``is_arch_support_pdl``, which its JIT kernels use, next to the copy in
``sgl_kernel``), ``equivalents`` answers the stand-in's name with that function, so a backend's
constructor can ask which GPU it runs on. Nothing that computes on tensors is ever answered.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["StandInCalled", "install", "spec_for", "used"]


class StandInCalled(RuntimeError):
    """Code reached a function of a package that is only stood in for on this machine."""


class _StandInMeta(type):
    def __call__(cls, *args, **kwargs):
        raise StandInCalled(
            f"{cls._standin_path} was called, but {cls._standin_package} is not installed here "
            f"(a stand-in lets sglang import on this machine; nothing of it runs)"
        )

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make(f"{cls._standin_path}.{name}", cls._standin_package)

    def __bool__(cls):
        return False

    def __repr__(cls):
        return f"<stand-in {cls._standin_path}>"


def _make(path: str, package: str) -> type:
    return _StandInMeta(path.rsplit(".", 1)[-1], (), {"_standin_path": path, "_standin_package": package})


_EQUIVALENTS: dict[str, str] = {}  # stand-in path -> "module:function" of the code base's own copy


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        path = f"{self.__name__}.{name}"
        if path in _EQUIVALENTS:
            import importlib

            module, _, attr = _EQUIVALENTS[path].partition(":")
            value = getattr(importlib.import_module(module), attr)
        else:
            value = _make(path, self.__name__.split(".")[0])
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: its submodules are stand-ins too
        module.__sglfix_standin__ = True
        # Probes (transformers') read a version when they find the package: an old one, so no
        # feature gate opens on a stand-in.
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):
        pass


def spec_for(fullname: str) -> importlib.machinery.ModuleSpec:
    """The module spec of a stand-in for ``fullname`` (a package: its submodules are stand-ins
    too), for a finder of the caller's that stands in only for a while."""
    return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.packages:
            return spec_for(fullname)
        return None


_INSTALLED: list[str] = []


def install(packages: tuple[str, ...] | None = None, *, equivalents: dict[str, str] | None = None) -> list[str]:
    """Stand in for each of ``packages`` that cannot be found (None: those any profile names);
    the ones stood in for. ``equivalents``: stand-in path -> ``module:function`` answering that
    capability query."""
    if packages is None:
        from sglfix.codebases.records import profiles

        packages = tuple(dict.fromkeys(p for record in profiles().values() for p in record.standins))
    _EQUIVALENTS.update(equivalents or {})
    missing = []
    for name in packages:
        if name in _INSTALLED:
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        sys.meta_path.append(_Finder(tuple(missing)))  # last: a real package always wins
        _INSTALLED.extend(missing)
    return list(_INSTALLED)


def used() -> list[str]:
    return list(_INSTALLED)
