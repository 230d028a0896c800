"""What several test files build the same way: the repository's root, the worker pool's test
cells and toggles, git repositories and their commits, and venvs that borrow this environment's
packages. Fixtures shared the same way are in conftest.py."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

# The checkout these tests belong to, wherever in tests/ a file sits.
ROOT = Path(__file__).resolve().parent.parent


# -- cells and toggles for the worker pool --------------------------------------------------------

SCEN = "triton-decode@cg=eager,gpu_only=off"
SCEN2 = "triton-extend"
# Where a test toggle edits the reproduction: a function every triton cell runs, at a line it has once.
TARGET = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
ANCHOR = "bs = forward_batch.batch_size\n"
# A toggle that leaves its class changed after its cell (the pool must replace the worker), and
# one that changes nothing.
LEAK_CLASS, BENIGN = 90008, 90009


@dataclass(frozen=True)
class Cell:
    id: str
    scenario: object
    toggles: tuple[str, ...]


_SCENARIOS: dict = {}


def cell(name: str, *toggles: str) -> Cell:
    """A cell of the built-in scenario ``name`` with ``toggles`` reverted, as the pool takes it."""
    if not _SCENARIOS:
        from sglfix.scenario import load_scenarios

        _SCENARIOS.update((s.name, s) for s in load_scenarios([], builtin=True))
    return Cell(id=f"{name}|{','.join(toggles)}", scenario=_SCENARIOS[name], toggles=tuple(toggles))


def write_toggle(
    directory: Path,
    pr: int,
    *,
    preamble: str = "",
    target: str = TARGET,
    match: str = ANCHOR,
    append: str = "pass\n",
    title: str | None = None,
) -> None:
    """``directory/<pr>.yaml``: a toggle whose one patch appends ``append`` after ``match`` in
    ``target``, its ``preamble`` (dedented) run where the patch applies."""
    import yaml

    patch = {"target": target, "edits": [{"match": match, "append": append}]}
    if preamble:
        patch["preamble"] = textwrap.dedent(preamble).strip() + "\n"
    text = yaml.safe_dump({"pr": pr, "title": title or f"test toggle {pr}", "patches": [patch]}, sort_keys=False)
    (directory / f"{pr}.yaml").write_text(text)


def write_class_leak(directory: Path) -> None:
    """LEAK_CLASS, whose cell leaves its backend class's method replaced, and BENIGN."""
    write_toggle(
        directory,
        LEAK_CLASS,
        preamble="""
        def _leaked(*args, **kwargs):
            raise RuntimeError("class state leaked from 90008")
        type(self)._fill_kv_indices = _leaked
    """,
    )
    write_toggle(directory, BENIGN)


def assert_matched(results, cells) -> None:
    """The pool's results are those of ``cells``, one each, in their order."""
    assert len(results) == len(cells)
    for r, c in zip(results, cells):
        assert (r.scenario, tuple(r.toggles)) == (c.scenario.name, c.toggles), (r, c)

