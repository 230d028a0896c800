"""The catalogue as a check of the operators (``sglfix.mutation.catalogue``): a toggle part whose
revert one generated mutant makes is ``exact`` (and that mutant really gives the reverted
function), one a mutant comes near is ``close``, one nothing touches is ``none`` with the
revert's change named. Source only: no cell runs."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from sglfix.common.codebase import package_dir
from sglfix.mutation.catalogue import CatalogueRow, catalogue_counts, check_catalogue
from sglfix.mutation.operators import mutants_of_function


def _code(source: str) -> str:
    """A function's code, a ``pass`` beside other statements being no statement."""
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        for name in ("body", "orelse"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and len(stmts) > 1:
                setattr(node, name, [s for s in stmts if not isinstance(s, ast.Pass)] or stmts[:1])
    return ast.dump(tree.body[0])


def _assert_exact(row: CatalogueRow, *, root: Path, package: str, registry) -> None:
    """The row's mutant, made again, turns the function into what the part's revert makes."""
    from sglfix.patching.editor import apply_edits
    from sglfix.toggling.doctor import locate_in

    assert row.match == "exact" and row.mutant and row.operator, row
    filename, source, first = locate_in(root, row.function[len(package) + 1 :].split("."), row.function)
    module = Path(filename).relative_to(root).with_suffix("").parts
    qualname = ".".join(row.function[len(package) + 1 :].split(".")[len(module) :])
    (m,) = [
        m
        for m in mutants_of_function(Path(filename).read_text(), qualname=qualname, function=row.function, path="x.py")
        if m.id == row.mutant
    ]
    assert m.operator == row.operator
    lines = source.splitlines()
    mutated = "\n".join(lines[: m.line - first] + m.mutated.split("\n") + lines[m.end_line - first + 1 :])
    toggle, part = row.toggle.split(":")
    (t,) = [t for t in registry if t.id == toggle]
    reverted = source
    for p in t.parts[part].patches:
        if p.target == row.function:
            reverted = apply_edits(source=reverted, edits=p.edits)
    assert _code(mutated) == _code(reverted)


def test_the_reproductions_fixes_are_generated_mutants():
    from sglfix.codebases import get_codebase
    from sglfix.toggling.registry import load_registry

    registry = load_registry(get_codebase("reproduction").toggles_dir)
    root = Path(package_dir("sglfix.backends"))
    rows = check_catalogue(registry=registry, package="sglfix.backends", source_root=root, repo_prefix="backends/")
    by = {}
    for r in rows:
        by.setdefault(r.toggle, []).append(r)
    # Every function of every part that has a revert is a row.
    assert len(rows) == sum(len(p.targets) for t in registry for p in t.parts.values() if not p.absent)
    # The padding clamp (its revert deletes torch.clamp(kv_lens, min=0)) in capture and replay.
    assert len(by["26651:clamp"]) == 2
    for row in by["26651:clamp"]:
        _assert_exact(row, root=root, package="sglfix.backends", registry=registry)
        assert row.change == "kv_lens = torch.clamp(kv_lens, min=0) -> (deleted)"
        assert row.at and row.at.startswith("backends/srt/layers/attention/triton_backend.py:")
    # The dropped + num_draft_tokens and - extend_seq_lens: one dropped addend each.
    for row in by["26651:fixture"] + by["26651:triton-kv-lens"]:
        _assert_exact(row, root=root, package="sglfix.backends", registry=registry)
        assert row.operator == "drop-addend"
    counts = catalogue_counts(rows)
    assert sum(counts.values()) == len(rows)


def test_a_revert_no_operator_makes_is_none_with_its_change(tmp_path):
    from sglfix.toggling.registry import load_registry

    src = tmp_path / "src" / "fakepkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "meta.py").write_text(
        textwrap.dedent(
            """\
            class Builder:
                def build(self, batch):
                    seq_lens = batch.prefix_lens + batch.num_draft_tokens
                    mask = batch.spec_mask
                    self.out = (seq_lens, mask)
            """
        )
    )
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    (toggles / "99999.yaml").write_text(
        textwrap.dedent(
            """\
            pr: 99999
            title: made-up fixes of one builder
            parts:
              addend:
                summary: the draft tokens added to the lengths
                patches:
                  - target: fakepkg.meta.Builder.build
                    edits:
                      - match: seq_lens = batch.prefix_lens + batch.num_draft_tokens
                        replacement: seq_lens = batch.prefix_lens
              mask:
                summary: the mask read where no operator changes anything
                patches:
                  - target: fakepkg.meta.Builder.build
                    edits:
                      - match: mask = batch.spec_mask
                        replacement: mask = batch.spec_mask.flip(0)
              gone:
                summary: a function this source does not have
                patches:
                  - target: fakepkg.meta.Builder.plan
                    edits:
                      - match: x = 1
                        replacement: x = 2
            """
        )
    )
    registry = load_registry(toggles)
    rows = {
        r.toggle: r
        for r in check_catalogue(registry=registry, package="fakepkg", source_root=src, repo_prefix="lib/fakepkg/")
    }
    assert rows["99999:addend"].match == "exact" and rows["99999:addend"].operator == "drop-addend"
    _assert_exact(rows["99999:addend"], root=src, package="fakepkg", registry=registry)
    mask = rows["99999:mask"]
    assert (mask.match, mask.mutant, mask.operator) == ("none", None, None)
    assert mask.change == "mask = batch.spec_mask -> mask = batch.spec_mask.flip(0)"
    assert mask.at == "lib/fakepkg/meta.py:4"
    gone = rows["99999:gone"]
    assert gone.match == "none" and gone.change.startswith("not compared:") and "plan" in gone.change
    # Paths as the code base's repository names them, never this machine's.
    assert str(tmp_path) not in gone.change and "lib/fakepkg/meta.py" in gone.change
    assert catalogue_counts(list(rows.values())) == {"exact": 1, "close": 0, "none": 2}
