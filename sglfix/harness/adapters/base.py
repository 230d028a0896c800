"""What every backend adapter provides to the cell runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from sglfix.harness.invariants import MetadataFields

__all__ = ["BackendAdapter", "Prepared", "MetadataHook"]

# (backend, forward_batch, phase) -> None, called after every metadata init
MetadataHook = Callable[[Any, Any, str], None]


@dataclass
class Prepared:
    """A case ready to run: the backend's inputs and the judge's ground truth."""

    case: Any
    num_slots: int  # size of the KV pool: every page/slot index must lie below it


class BackendAdapter(Protocol):
    name: str
    metadata_fields: MetadataFields

    def build(self, scenario: Any, *, device: str) -> Prepared:
        """Pools, cached K/V, new tokens and the forward batch; code under test may run here."""

    def make_backend(self, prepared: Prepared) -> Any:
        """A fresh backend over the case's pools."""

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """A captured graph runner for graph scenarios, else None; runs outside the sync watch."""

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """The forward for the scenario's mode: eager, or a replay of ``runner``; returns the output."""

    def static_buffers(self, backend: Any) -> list:
        """Registered static buffers (with guard zones) after the run."""

    def rows(self, forward_batch: Any) -> int:
        """Rows (requests, padded ones included) the live metadata covers."""

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        """(reference output, packed output -> padded layout) from the ground truth only."""
