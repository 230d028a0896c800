"""The docs stay true to the code: the command-line reference is the app's."""

from __future__ import annotations

import re
from pathlib import Path

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
