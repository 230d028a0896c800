"""What the sglang probes share: publishing server args the way sglang's own test kit does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["bound", "ceil_to", "published", "runners_unpublished"]


@contextlib.contextmanager
def published(**server_args: Any) -> Iterator[None]:
    """Publish a dummy ServerArgs carrying ``server_args`` (sglang reads them through
    ``runtime_context.get_spec()/get_schedule()/...``), as the kit's MockModelRunner does; the
    runtime context is put back exactly as it was afterwards."""
    from sglfix.harness.kits import kit

    with kit("probes").published(**server_args):
        yield


def ceil_to(value: int, step: int) -> int:
    return -(-value // step) * step


@contextlib.contextmanager
def runners_unpublished() -> Iterator[None]:
    """For a probe that builds backends the way the adapters do: their mock runners publish server
    args, and what was published before is put back afterwards, whatever happens."""
    from sglfix.harness.kits import kit

    try:
        yield
    finally:
        kit("attention").restore_server_args()


_ABSENT = object()


@contextlib.contextmanager
def bound(target: Any, **values: Any) -> Iterator[None]:
    """``values`` bound as attributes of ``target`` (a module or a class) for the block: what a
    probe stands in for around the code under test (a kernel launch, a device query). The target's
    own attributes are put back afterwards, and a name it did not have is removed again."""
    saved = {name: vars(target).get(name, _ABSENT) for name in values}
    try:
        for name, value in values.items():
            setattr(target, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is not _ABSENT:
                setattr(target, name, value)
            elif name in vars(target):
                delattr(target, name)
