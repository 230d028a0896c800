"""What the sglang probes share: publishing server args the way sglang's own test kit does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["ceil_to", "published", "runners_unpublished"]


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
