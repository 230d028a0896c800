"""Every registered adapter provides every method ``BackendAdapter`` declares, with the same
parameters, so that the cell calls each of them directly (no probing for optional ones)."""

from __future__ import annotations

import inspect

import pytest

from sglfix.harness.adapters.base import AdapterBase, BackendAdapter


def _declared() -> tuple[set[str], dict[str, inspect.Signature]]:
    """(attributes, methods -> signature) that the protocol declares."""
    attributes = set(BackendAdapter.__annotations__)
    methods = {
        name: inspect.signature(member)
        for name, member in vars(BackendAdapter).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    return attributes, methods


def _registered() -> list[tuple[str, str]]:
    """(code base, backend) for every adapter of every profile record (``[adapters]``)."""
    from sglfix.codebases import profiles

    return sorted((cb.name, backend) for cb in profiles().values() for backend in cb.adapters)


def _broken(adapter: object) -> list[str]:
    """What ``adapter`` lacks of the protocol, or declares otherwise."""
    attributes, methods = _declared()
    bad = [f"not an AdapterBase: {type(adapter).__qualname__}"] if not isinstance(adapter, AdapterBase) else []
    bad += [f"no attribute {name}" for name in sorted(attributes) if not hasattr(adapter, name)]
    for name, declared in sorted(methods.items()):
        member = inspect.getattr_static(type(adapter), name, None)
        if not inspect.isfunction(member):
            bad.append(f"no method {name}")
            continue
        got = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
        want = [(p.name, p.kind) for p in declared.parameters.values()]
        if got != want:
            bad.append(f"{name}{inspect.signature(member)} is not {name}{declared}")
    return bad


def test_the_protocol_declares_what_the_cell_calls():
    attributes, methods = _declared()
    assert attributes == {"name", "metadata_fields"}
    assert {"check_available", "check_metadata", "build", "run", "reference"} <= set(methods)
    # The defaults come from the base and only there: everything else each adapter must define.
    assert {n for n in methods if inspect.getattr_static(AdapterBase, n, None)} == {
        "check_available",
        "check_metadata",
        "unread_fields",
    }


def test_a_class_missing_a_method_is_found():
    class Partial(AdapterBase):
        name = "partial"

        def build(self, scenario, *, device):  # a parameter renamed below is found too
            return None

        def run(self, prepared, backend, runner, *, scenario, on_metadata):
            return None

    found = _broken(Partial())
    assert "no attribute metadata_fields" in found and "no method reference" in found
    assert "no method check_metadata" not in found  # the base's default
    assert not any(m.startswith(("build", "run")) for m in found), found

    class Renamed(Partial):
        def build(self, scene, *, device):
            return None

    assert any(m.startswith("build(") for m in _broken(Renamed()))
    assert _broken(object())[0] == "not an AdapterBase: object"


@pytest.mark.parametrize("codebase,backend", _registered())
def test_every_registered_adapter_provides_the_protocol(codebase, backend):
    from sglfix.codebases import get_codebase
    from sglfix.harness.adapters import get_adapter

    adapter = get_adapter(backend, get_codebase(codebase))
    assert adapter.name == backend
    assert _broken(adapter) == []
