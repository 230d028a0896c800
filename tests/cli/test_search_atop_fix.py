"""``sglfix search --mutant ID --apply FIX.patch``: a mutant that no scenario shows on the code as
it is (fewer KV splits merge the same softmax) shown once every cell runs atop a fix that makes the
line it changes load-bearing (no lower clamp on the split count: a request split zero ways)."""

from __future__ import annotations

import json
from pathlib import Path

from clihelp import run_cli

from sglfix.common.codebase import package_dir
from sglfix.mutation.diff import mutant_diff
from sglfix.report.search import SearchReport

REL = "srt/layers/attention/triton_backend.py"
MUTANT = "m-4e11633dfc"  # (seq_lens - 1) // _KV_SPLIT_TILE: one split fewer where a tile fills exactly
ARGS = ["search", "--mutant", MUTANT, "--function", "get_num_kv_splits", "--family", "triton", "--device", "cpu"]
ARGS += ["--examples", "6", "--no-cache"]


def _no_lower_clamp(folder: Path) -> Path:
    """A candidate fix file that drops get_num_kv_splits' lower clamp (harmless alone: every
    request's count is at least one)."""
    path = Path(package_dir("sglfix.backends")) / REL
    text = path.read_text()
    lines = text.splitlines()
    (i,) = [k for k, line in enumerate(lines) if line.strip() == "min=1,"]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    out = folder / "clamp0.patch"
    out.write_text(
        mutant_diff(
            path="backends/" + REL, file_text=text, line=i + 1, end_line=i + 1, mutated=indent + "min=0,", title="x"
        )
    )
    return out


def test_a_mutant_no_scenario_shows_is_killed_atop_the_fix_that_makes_its_line_matter(tmp_path):
    from sglfix.codebases import get_codebase
    from sglfix.execution.mutate import mutants_on_surface

    assert MUTANT in {
        m.id for m in mutants_on_surface(codebase=get_codebase("reproduction"), functions=("get_num_kv_splits",))
    }
    alone = tmp_path / "alone.json"
    result = run_cli(*ARGS, "--json", str(alone), subprocess=True, timeout=300)
    assert result.code == 0, (result.out, result.err)
    assert json.loads(alone.read_text())["found"] is None
    fix = _no_lower_clamp(tmp_path)
    atop = tmp_path / "atop.json"
    result = run_cli(*ARGS, "--apply", str(fix), "--json", str(atop), subprocess=True, timeout=300)
    assert result.code == 1, (result.out, result.err)
    data = SearchReport.model_validate(json.loads(atop.read_text()))
    # The fix is what every cell ran atop; the change searched for is the mutant's alone.
    assert data.target == "mutant" and data.base == ["+clamp0"] and data.applied == ["+" + MUTANT]
    assert data.shrunk is not None and data.shrunk.meaning == "BROKEN", data.shrunk
    assert "+clamp0,+" + MUTANT in result.out
