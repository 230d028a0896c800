"""What every backend adapter provides to the cell runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

if TYPE_CHECKING:
    import torch

    from sglfix.harness.unavailable import NoOutput
    from sglfix.scenario.models import Scenario

__all__ = ["AdapterBase", "BackendAdapter", "Dispatch", "MetadataHook", "Prepared", "require_flashinfer"]


def require_flashinfer(device: str) -> None:
    """FlashInfer backends run FlashInfer's kernels on CUDA (the torch stand-ins are CPU-only)."""
    import importlib.util

    import torch

    if torch.device(device).type == "cuda" and importlib.util.find_spec("flashinfer") is None:
        raise Unavailable(
            "FlashInfer is not installed on this CUDA machine; "
            "pip install flashinfer-python==0.7.2.post1 (or run with --device cpu)"
        )


# (backend, forward_batch, phase) -> None, called after every metadata init
MetadataHook = Callable[[Any, Any, str], None]


@dataclass
class Prepared:
    """A case ready to run: the backend's inputs and the judge's ground truth."""

    case: Any
    num_slots: int  # size of the KV pool: every page/slot index must lie below it


class BackendAdapter(Protocol):
    """Every method the cell runner calls on an adapter, in the order it calls them. An adapter
    takes the defaults of ``check_available`` and ``check_metadata`` from ``AdapterBase``."""

    name: str
    metadata_fields: MetadataFields

    def check_available(self, device: str) -> None:
        """Raise ``Unavailable`` when the cell cannot run on ``device`` here; before the build."""

    def build(self, scenario: Scenario, *, device: str) -> Prepared:
        """Pools, cached K/V, new tokens and the forward batch; code under test may run here."""

    def make_backend(self, prepared: Prepared) -> Any:
        """A fresh backend over the case's pools."""

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Scenario, on_metadata: MetadataHook) -> Any:
        """A captured graph runner for graph scenarios, else None; runs outside the sync watch."""

    def run(
        self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Scenario, on_metadata: MetadataHook
    ) -> torch.Tensor | NoOutput:
        """The forward for the scenario's mode: eager, or a replay of ``runner``; returns the output
        (or ``sglfix.harness.unavailable.NoOutput`` where no output can be produced here)."""

    def static_buffers(self, backend: Any) -> list:
        """Registered static buffers (with guard zones) after the run."""

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """(label, metadata object, rows it covers) for every metadata object live after an
        init: one for a single backend, one per step for a multi-step draft backend."""

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """(verdict, message) of the adapter's own metadata checks after the run, PASS rows naming
        what was checked; [] when it has none."""

    def reference(self, prepared: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
        """(reference output, the rows to compare) from the ground truth only."""

    def unread_fields(self, prepared: Prepared, backend: Any) -> dict[str, str]:
        """After the run: metadata fields no kernel of this cell read (field -> why), left out of
        the cell's metadata digest (``sglfix.harness.fingerprint``)."""


class AdapterBase:
    """What every adapter inherits: the documented defaults of the ``BackendAdapter`` methods an
    adapter may leave out, so that the cell calls each of them on every adapter."""

    def check_available(self, device: str) -> None:
        """Runs wherever it is built: nothing to check before the build."""

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """No checks beyond the invariant table and the guard zones."""
        return []

    def unread_fields(self, prepared: Prepared, backend: Any) -> dict[str, str]:
        """Every field digested: the adapter declares none unread."""
        return {}

    def judges_batch_invariance(self, scenario: Any) -> bool:
        """Whether this adapter's cell of ``scenario`` judges deterministic inference's promise
        (a request's reduction order whatever the batch) itself: where it does, its schedule
        fields stay schedule under deterministic inference (``MetadataFields.schedule``)."""
        return False


class Dispatch(AdapterBase):
    """One ``backend:`` whose cells two adapters build, by the scenario: every call goes to the
    adapter that built the cell, told by the scenario (``_for_scenario``), the case it built
    (``_by_case``) or the backend it made (``_by_backend``)."""

    def _for_scenario(self, scenario: Any) -> Any:
        raise NotImplementedError

    def _by_case(self, prepared: Prepared) -> Any:
        raise NotImplementedError

    def _by_backend(self, backend: Any) -> Any:
        raise NotImplementedError

    def build(self, scenario: Any, *, device: str) -> Prepared:
        return self._for_scenario(scenario).build(scenario, device=device)

    def make_backend(self, prepared: Prepared) -> Any:
        return self._by_case(prepared).make_backend(prepared)

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        return self._by_case(prepared).capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        return self._by_case(prepared).run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)

    def static_buffers(self, backend: Any) -> list:
        return self._by_backend(backend).static_buffers(backend)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        return self._by_backend(backend).metadata_views(backend, forward_batch)

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        return self._by_case(prepared).check_metadata(prepared, backend)

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        return self._by_case(prepared).reference(prepared)

    def unread_fields(self, prepared: Prepared, backend: Any) -> dict[str, str]:
        return self._by_case(prepared).unread_fields(prepared, backend)

    def judges_batch_invariance(self, scenario: Any) -> bool:
        return self._for_scenario(scenario).judges_batch_invariance(scenario)
