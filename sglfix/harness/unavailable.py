"""What a cell cannot do on this machine, said by the adapter that meets it: run at all
(``Unavailable``, a SKIP) or produce an attention output (``NoOutput``, judged on metadata).

A leaf: it imports nothing of sglfix, so that the cell runner (``sglfix.harness.cell``), the
adapters and the scenario kits below them all take these names from one place beneath them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NoOutput", "Unavailable"]


class Unavailable(Exception):
    """The cell cannot run on this machine (a SKIP with this reason, never a failure)."""


@dataclass(frozen=True)
class NoOutput:
    """What an adapter's ``run`` returns when no attention output can be produced here (a kernel
    this machine lacks): the cell then judges metadata only (invariants, guard zones and the
    adapter's ``check_metadata(prepared, backend) -> [(verdict, message)]``, PASS rows naming
    what was checked) and says why the output was not compared; nothing checked is a SKIP."""

    reason: str
