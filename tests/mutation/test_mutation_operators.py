"""The mutation operators on source text (``sglfix.mutation.operators``) and a mutant as a diff
(``sglfix.mutation.diff``): every operator makes mutants of a small function and of the
reproduction's metadata code, each a change of the function's body only that parses, and whose
diff ``--apply`` replays as a candidate fix. Nothing here runs a cell."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sglfix.common.codebase import package_dir
from sglfix.common.errors import ConfigError
from sglfix.mutation.diff import mutant_diff, show_mutant
from sglfix.mutation.model import Mutant
from sglfix.mutation.operators import OPERATORS, mutants_of_function
from sglfix.patching.editor import apply_edits

SYNTHETIC = '''\
import torch


class Backend:
    @staticmethod
    def helper(x):
        return x

    def init_forward_metadata(self, forward_batch, spec_info, in_capture: bool = False):
        """Docstring: bs + 1 and kv_indptr[: bs + 1] are words here."""
        bs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens[:bs]
        kv_lens = seq_lens - forward_batch.extend_seq_lens  # the page table covers the prefix
        kv_lens = torch.clamp(kv_lens, min=0)
        if forward_batch.forward_mode.is_target_verify():
            self.kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, dim=0)
        prefix = forward_batch.extend_prefix_lens
        self.fill_kv_indices(bs, seq_lens, kv_lens, self.kv_indptr)
        num_tokens = (
            self.num_draft_tokens if spec_info.is_draft_extend_v2() else self.speculative_num_steps + 1
        )
        self.forward_metadata = (kv_lens, prefix, num_tokens)
'''
MODULE = "pkg.backend"
QUALNAME = "Backend.init_forward_metadata"
FUNCTION = f"{MODULE}.{QUALNAME}"


def _function_node(text: str, qualname: str) -> ast.FunctionDef:
    from sglfix.mutation.operators import function_node

    node = function_node(ast.parse(text), qualname)
    assert node is not None
    return node


def _applied(text: str, m: Mutant) -> str:
    lines = text.splitlines()
    return "\n".join(lines[: m.line - 1] + m.mutated.split("\n") + lines[m.end_line :]) + "\n"


def _check_mutant(text: str, m: Mutant, *, body_start: int, body_end: int, path: str) -> None:
    """A mutant of ``text`` as every consumer expects it: whole lines of the function's body
    replaced, the file still compiles, its id and diff are its own."""
    assert body_start <= m.line <= m.end_line <= body_end, (m.line, m.end_line, body_start, body_end)
    lines = text.splitlines()
    assert m.original == "\n".join(lines[m.line - 1 : m.end_line])
    assert m.mutated != m.original
    after = _applied(text, m)
    compile(after, path, "exec")  # the mutated file, not just the function
    assert "\n" not in m.description and m.description.strip()
    assert m.id.startswith("m-")
    assert m.diff == mutant_diff(
        path=m.path,
        file_text=text,
        line=m.line,
        end_line=m.end_line,
        mutated=m.mutated,
        title=m.diff.split("\n")[0][9:],
    )


def _body_range(text: str, qualname: str) -> tuple[int, int]:
    node = _function_node(text, qualname)
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring is not the body a mutant changes
    return body[0].lineno, node.end_lineno


def test_each_operator_mutates_a_small_function():
    start, end = _body_range(SYNTHETIC, QUALNAME)
    everything = mutants_of_function(SYNTHETIC, qualname=QUALNAME, function=FUNCTION, path="pkg/backend.py")
    for name in OPERATORS:
        found = mutants_of_function(
            SYNTHETIC, qualname=QUALNAME, function=FUNCTION, path="pkg/backend.py", operators=[name]
        )
        assert found, f"{name} made no mutant"
        assert {m.operator for m in found} == {name}
        for m in found:
            _check_mutant(SYNTHETIC, m, body_start=start, body_end=end, path="pkg/backend.py")
            assert m.function == FUNCTION and m.path == "pkg/backend.py"
        # What an operator makes among all of them it makes alone, with the same ids (alone it
        # may keep a change that, among all, an earlier operator's equal change stands for).
        assert {m.id for m in everything if m.operator == name} <= {m.id for m in found}
    ids = [m.id for m in everything]
    assert len(ids) == len(set(ids))
    # Deterministic, in order of line.
    again = mutants_of_function(SYNTHETIC, qualname=QUALNAME, function=FUNCTION, path="pkg/backend.py")
    assert [m.id for m in again] == ids
    assert [m.line for m in everything] == sorted(m.line for m in everything)


def test_the_catalogue_bug_shapes_are_among_the_mutants():
    """The bugs the fixes undo, written as the operators write them."""
    ms = mutants_of_function(SYNTHETIC, qualname=QUALNAME, function=FUNCTION, path="pkg/backend.py")

    def mutated_lines(operator: str) -> set[str]:
        return {m.mutated.strip() for m in ms if m.operator == operator}

    # The dropped subtrahend keeps the line's comment.
    assert "kv_lens = seq_lens  # the page table covers the prefix" in mutated_lines("drop-addend")
    assert "kv_lens = kv_lens" in mutated_lines("drop-addend")  # the clamp dropped
    assert "pass" in mutated_lines("skip-update")  # the cumsum into the static buffer, the clamp
    skipped = {m.original.strip() for m in ms if m.operator == "skip-update"}
    assert "self.kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, dim=0)" in skipped
    assert "kv_lens = torch.clamp(kv_lens, min=0)" in skipped
    assert "seq_lens = forward_batch.seq_lens[:]" in mutated_lines("slice-bound")
    assert "prefix = forward_batch.extend_seq_lens" in mutated_lines("swap-same-typed")
    assert "bs = (forward_batch.batch_size + 1)" in mutated_lines("off-by-one")
    # A mode check of a conditional expression dropped: the other branch alone.
    assert any(s == "self.speculative_num_steps + 1" for s in mutated_lines("drop-mode-check"))
    assert "if not forward_batch.forward_mode.is_target_verify():" in mutated_lines("negate-condition")
    assert any("None" in s and "fill_kv_indices" in s for s in mutated_lines("none-arg"))
    assert any("if in_capture else" in s for s in mutated_lines("capture-only") | mutated_lines("replay-only"))
    # The docstring, the decorator and the signature are never changed.
    assert not any("Docstring" in m.original or "def " in m.original for m in ms)


def test_unknown_operator_is_one_line_with_the_nearest_name():
    with pytest.raises(ConfigError) as info:
        mutants_of_function(
            SYNTHETIC, qualname=QUALNAME, function=FUNCTION, path="pkg/backend.py", operators=["off-by-on"]
        )
    message = str(info.value)
    assert "\n" not in message
    assert "'off-by-on'" in message and "did you mean 'off-by-one'" in message and "slice-bound" in message
    with pytest.raises(ConfigError) as info:
        mutants_of_function(SYNTHETIC, qualname="Backend.nope", function=FUNCTION, path="pkg/backend.py")
    assert "Backend.nope" in str(info.value) and "\n" not in str(info.value)


def test_a_mutant_diff_places_its_hunk_and_context():
    from unidiff import PatchSet

    text = "a\nb\nc\nd\ne\nf\ng\nh"  # no newline at the end
    diff = mutant_diff(path="p/x.py", file_text=text, line=4, end_line=5, mutated="D\nE\nE2", title="t 1")
    (pf,) = PatchSet(diff)
    assert pf.source_file == "a/p/x.py" and pf.target_file == "b/p/x.py"
    (hunk,) = pf
    assert (hunk.source_start, hunk.source_length, hunk.target_start, hunk.target_length) == (1, 8, 1, 9)
    assert [ln.value.rstrip("\n") for ln in hunk.source_lines()] == text.split("\n")
    assert [ln.value.rstrip("\n") for ln in hunk.target_lines()] == ["a", "b", "c", "D", "E", "E2", "f", "g", "h"]
    assert diff.startswith("Subject: t 1\n")
    m = Mutant(
        id="m-0123456789",
        function="p.x.f",
        path="p/x.py",
        line=4,
        end_line=5,
        operator="off-by-one",
        original="d\ne",
        mutated="D\nE\nE2",
        description="+ 1 on d",
        diff=diff,
    )
    shown = show_mutant(m)
    for part in ("m-0123456789", "p.x.f", "p/x.py:4-5", "off-by-one", "+ 1 on d"):
        assert part in shown.split("\n\n")[0]
    assert shown.endswith(diff)


# The reproduction's metadata code: the Triton backend's builders, and the DeepSeek V4 backend's
# shared capture/replay body (its in_capture flag is what capture-only and replay-only need).
REAL = (
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata"),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata_capture_cuda_graph"),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata_replay_cuda_graph"),
    ("srt/layers/attention/deepseek_v4_backend.py", "DeepseekV4AttnBackend.init_forward_metadata_out_graph"),
)


def test_each_operator_mutates_the_reproduction_and_its_diffs_apply(tmp_path):
    from sglfix.codebases import get_codebase
    from sglfix.toggling.candidate import load_candidate

    root = Path(package_dir("sglfix.backends"))
    codebase = get_codebase("reproduction")
    by_operator: dict[str, list[tuple[str, Mutant]]] = {}
    for rel, qualname in REAL:
        text = (root / rel).read_text()
        start, end = _body_range(text, qualname)
        function = "sglfix.backends." + rel[: -len(".py")].replace("/", ".") + "." + qualname
        for m in mutants_of_function(text, qualname=qualname, function=function, path="backends/" + rel):
            _check_mutant(text, m, body_start=start, body_end=end, path=rel)
            by_operator.setdefault(m.operator, []).append((text, m))
    assert set(by_operator) == set(OPERATORS)
    for name, found in by_operator.items():
        for text, m in (found[0], found[len(found) // 2], found[-1]):  # a sample of each operator's
            patch = tmp_path / f"{m.id}.patch"
            patch.write_text(m.diff)
            candidate = load_candidate(patch, codebase=codebase)
            assert candidate.functions == (m.function,), name
            # What --apply installs is the mutated function: its edits turn the installed
            # function into the mutant's.
            node = _function_node(text, m.function.rsplit(".", 2)[-2] + "." + m.function.rsplit(".", 1)[-1])
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = text.splitlines()
            source = "\n".join(lines[first - 1 : node.end_lineno]) + "\n"
            want = "\n".join(
                _applied(text, m).splitlines()[
                    first - 1 : node.end_lineno + m.mutated.count("\n") - (m.end_line - m.line)
                ]
            )
            (spec,) = candidate.part.patches
            got = apply_edits(source=source, edits=spec.edits)
            assert _code_lines(got) == _code_lines(want), (name, m.description)


def _code_lines(source: str) -> list[str]:
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def test_a_property_accessor_pair_has_no_mutant():
    """A getter and a setter share one dotted name: no one function to change."""
    text = "class A:\n    @property\n    def n(self):\n        return self._n + 1\n\n    @n.setter\n    def n(self, v):\n        self._n = v - 1\n"
    assert mutants_of_function(text, qualname="A.n", function="m.A.n", path="m.py") == []


def test_an_edit_above_a_function_keeps_its_mutants_ids():
    """Ids count lines from the function's own first line: an edit of another function of the
    file, above it, keeps them (and so the cells the result store keeps for them)."""
    text = (
        "def first(x):\n    return x + 1\n\n\n"
        "def second(kv_indptr, kv_lens, bs):\n    kv_indptr[1 : bs + 1] = kv_lens[:bs].cumsum(0)\n"
        "    return kv_indptr[: bs + 1]\n"
    )
    edited = text.replace("    return x + 1\n", "    y = 0\n    return x + 1\n")
    before = mutants_of_function(text, qualname="second", function="pkg.mod.second", path="pkg/mod.py")
    after = mutants_of_function(edited, qualname="second", function="pkg.mod.second", path="pkg/mod.py")
    assert before and [m.id for m in before] == [m.id for m in after]
    assert [m.line + 1 for m in before] == [m.line for m in after]
