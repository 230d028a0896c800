"""The docs stay true to the code: the command-line reference is the app's, every relative link
lands on a file and heading that exist, and the tables written from the code are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI_MD = ROOT / "docs" / "reference" / "cli.md"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "README.md"]


def test_the_cli_reference_is_the_apps():
    from sglfix.cli.reference import REGENERATE, render

    assert CLI_MD.is_file(), f"docs/reference/cli.md is missing; write it with: {REGENERATE}"
    assert CLI_MD.read_text() == render(), f"docs/reference/cli.md is out of date; write it again with: {REGENERATE}"


def test_the_cli_reference_names_every_command_and_option_whatever_the_terminal(monkeypatch):
    from typer.main import get_command

    from sglfix.cli.app import app
    from sglfix.cli.reference import render

    monkeypatch.setenv("COLUMNS", "300")
    wide = render()
    monkeypatch.setenv("COLUMNS", "40")
    assert render() == wide, "the reference depends on the terminal's width"

    def walk(cmd, path):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, f"{path} {name}")

    for path, cmd in walk(get_command(app), "sglfix"):
        assert f"\n## {path}\n" in wide, f"the reference has no section for {path}"
        section = wide.split(f"\n## {path}\n", 1)[1].split("\n## ", 1)[0]
        for param in cmd.params:
            if getattr(param, "hidden", False) or param.param_type_name != "option":
                continue
            for opt in param.opts:
                line = rf"^- `[^`]*(?<![\w-]){re.escape(opt)}(?![\w-])"
                assert re.search(line, section, re.M), f"the reference's {path} lacks {opt}"


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _without_blocks(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)


def _without_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", _without_blocks(text))


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _without_blocks(text), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _broken_links(page: Path, text: str) -> list[str]:
    broken = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _without_code(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path and not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text() if path else text):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_heading_that_exist(page):
    broken = _broken_links(page, page.read_text())
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## The `cache` command, again\n\n## Title\n")
    page = tmp_path / "page.md"
    text = (
        "[ok](other.md#the-cache-command-again) [ok](other.md#title-1) [ok](#here) [web](https://x.y/z)\n"
        "`[not a link](nowhere.md)`\n\n## Here\n\n```bash\n[nor this](gone.md)\n```\n"
        "[file](missing.md) [heading](other.md#nope) [self](#there)\n"
    )
    assert _broken_links(page, text) == [
        "missing.md (no such file)",
        "other.md#nope (no heading #nope in other.md)",
        "#there (no heading #there in page.md)",
    ]


def test_the_scenario_limits_table_is_the_codes():
    from sglfix.scenario import limits_markdown

    text = (ROOT / "docs" / "reference" / "scenario-files.md").read_text()
    assert limits_markdown() in text, "docs/reference/scenario-files.md's limits table differs from LIMITS"


def test_every_variable_sglfix_reads_is_documented_and_none_other():
    names = set()
    for path in [*(ROOT / "sglfix").rglob("*.py"), ROOT / "zz-sglfix-startup.pth"]:
        names |= set(re.findall(r"\b(SGLFIX_[A-Z0-9_]*[A-Z0-9]|SGLANG_DEBUG_REVERT_PR)\b", path.read_text()))
    documented = set(re.findall(r"^\| `([A-Z_0-9]+)` \|", (ROOT / "docs/reference/environment.md").read_text(), re.M))
    assert names, "no SGLFIX_ variable found in the code"
    assert not names - documented, f"docs/reference/environment.md lacks {sorted(names - documented)}"
    stale = {n for n in documented if n.startswith("SGLFIX_") or n == "SGLANG_DEBUG_REVERT_PR"} - names
    assert not stale, f"docs/reference/environment.md documents variables no code reads: {sorted(stale)}"
