"""Mutants atop candidate fixes (``sglfix mutate --apply``): which mutants' edits still apply to
their function once the fixes have edited it, with the patch engine's own text edits in the order
the workers make them (the fixes first)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["replaced_by"]


def replaced_by(fixes: Sequence[Any], mutants: Sequence[Any], *, codebase: Any) -> dict[str, str]:
    """The mutants (id -> why) whose edits do not apply to their function as ``fixes`` rewrite it
    (the same text edits the workers make, in the same order: the fixes first): a line the fixes
    replace has no mutant atop them."""
    from sglfix.common.codebase import package_dir
    from sglfix.common.errors import PatchApplicationError, SglfixError
    from sglfix.mutation.catalogue import locate_function, patched_source

    fixed: dict[str, list[Any]] = {}
    for f in fixes:
        for p in f.part.patches:
            fixed.setdefault(p.target, []).append((f.id, p))
    root = package_dir(codebase.package)
    out: dict[str, str] = {}
    for m in mutants:
        for patch in m.part.patches:
            if patch.target not in fixed or root is None:
                continue
            names = ", ".join(dict.fromkeys(fid for fid, _ in fixed[patch.target]))
            try:
                path, _qual, source, first = locate_function(patch.target, codebase.package, Path(root))
                patched_source(source, [*(p for _, p in fixed[patch.target]), patch], filename=str(path), first=first)
            except (PatchApplicationError, SglfixError):
                out[m.id.removeprefix("+")] = f"{names} rewrites its line in {patch.target.rsplit('.', 1)[-1]}"
    return out
