"""sglfix: revert historical attention-metadata fixes and replay scenarios to see which one matters.

The public names keep sglang's ``source_patcher`` call shapes, so a caller can swap one import:
``from sglfix import apply_patches_from_config, CodePatcher``. Imports are lazy: ``sglfix list``
must not pay for torch or for the backends.
"""

from __future__ import annotations

# typing costs every process that imports sglfix (the start-up hook's included) a few ms; the
# annotations are strings, so a type checker alone needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any


def _source_checkout_layout() -> None:
    # Installed, backends/, toggles/ and scenarios/ sit inside this package (pyproject maps
    # them). Run from a source checkout without installing (PYTHONPATH=., python -m in the
    # repo root), they sit next to it: add the checkout to the package path so that
    # sglfix.backends, sglfix.toggles and sglfix.scenarios resolve the same way.
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    marker = os.path.join(root, "pyproject.toml")
    if os.path.isfile(os.path.join(root, "backends", "__init__.py")) and os.path.isfile(marker):
        with open(marker, encoding="utf-8") as fh:
            if 'name = "sglfix"' in fh.read():
                __path__.append(root)  # type: ignore[name-defined]


_source_checkout_layout()

_EXPORTS = {
    # Read on use, like the rest: importing sglfix (every engine process, the start-up hook)
    # loads no module for it.
    "__version__": "sglfix.common.version",
    "apply_patches_from_config": "sglfix.patching.patcher",
    "CodePatcher": "sglfix.patching.patcher",
    "patch_function": "sglfix.patching.patcher",
    "PatchState": "sglfix.patching.patcher",
    "EditSpec": "sglfix.patching.types",
    "PatchSpec": "sglfix.patching.types",
    "PatchConfig": "sglfix.patching.types",
    "PatchApplicationError": "sglfix.common.errors",
    "SglfixError": "sglfix.common.errors",
    "ConfigError": "sglfix.common.errors",
    "load_registry": "sglfix.toggling.registry",
}

__all__ = [
    "CodePatcher",
    "ConfigError",
    "EditSpec",
    "PatchApplicationError",
    "PatchConfig",
    "PatchSpec",
    "PatchState",
    "SglfixError",
    "apply_patches_from_config",
    "load_registry",
    "maybe_revert_pr_fix",
    "patch_function",
    "reverted_ids",
]


def reverted_ids() -> list:
    """Ids of the parts reverted in this process now (by the start-up hook, an explicit
    ``maybe_revert_pr_fix()`` or ``revert()``), in the order they went in. Imports nothing
    when nothing was ever reverted."""
    import sys

    hook = sys.modules.get("sglfix.toggling.hook")
    if hook is not None and hook.armed() is not None:
        hook.armed().apply_ready()  # a target another import hook loaded past the finder goes in now
    module = sys.modules.get("sglfix.toggling.revert")
    return module.reverted_ids() if module is not None else []


def maybe_revert_pr_fix(*, registry: Any = None, allowed_prefixes: Any = None) -> Any:
    """Apply what ``REVERT_PR`` selects, once per process (``sglfix.toggling.env``).

    An engine calls this from every process whether or not a revert is wanted: unset or ``0``,
    with nothing applied before, it returns None having imported nothing (no YAML, no registry,
    no pydantic), which is what the full version would return too.
    """
    import sys

    from sglfix.common.environ import envs
    from sglfix.toggling import selects_nothing

    value = envs.REVERT_PR.get()
    if selects_nothing(value) and registry is None and "sglfix.toggling.env" not in sys.modules:
        return None
    from sglfix.toggling.env import maybe_revert_pr_fix as apply

    return apply(registry=registry, allowed_prefixes=allowed_prefixes)


if TYPE_CHECKING:  # pragma: no cover
    from sglfix.common.errors import ConfigError, PatchApplicationError, SglfixError
    from sglfix.common.version import __version__ as __version__
    from sglfix.patching.patcher import CodePatcher, PatchState, apply_patches_from_config, patch_function
    from sglfix.patching.types import EditSpec, PatchConfig, PatchSpec
    from sglfix.toggling.registry import load_registry


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'sglfix' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
