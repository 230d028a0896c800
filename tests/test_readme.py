"""The README's commands are what CI runs, verbatim; what the README and docs/ show exists, and the
figures they quote are counted from the reports they cite."""

from __future__ import annotations

import json
import re
from pathlib import Path

from builders import ROOT


def _docs() -> str:
    """The README and every page of docs/: the commands and claims they show."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(p.read_text() for p in pages)


def _readme_command(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\s*```bash\n(.+?)\n```", text, re.S)
    assert m, f"README has no {marker} block"
    lines = m.group(1).strip().splitlines()
    assert len(lines) == 1, f"the {marker} must be one command line"
    return lines[0]


def test_ci_runs_the_readme_test_command_verbatim():
    command = _readme_command("test-command")
    ci_lines = [
        line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert command in ci_lines, f".ci/run must contain the README test command verbatim:\n{command}"
    assert _readme_command("sglang-command") in ci_lines, ".ci/run must run the README's real-sglang command too"
    release = _readme_command("sglang-release-command")
    assert release in ci_lines, ".ci/run must run the README's older-release command too"
    # After the real-sglang set-up, in its venv: the release runs beside the installed 0.5.23.
    assert ci_lines.index(release) > ci_lines.index(_readme_command("sglang-command"))
    main = _readme_command("main-command")
    assert main.startswith("python3 -m venv .venv") and "sglfix " in main


def test_ci_script_names_only_files_that_exist():
    text = (ROOT / ".ci/run").read_text()
    for name in re.findall(r"tests/[\w/]+\.py", text):
        assert (ROOT / name).is_file(), f".ci/run mentions {name}, which does not exist"


def test_readme_claims_only_what_exists():
    text = _docs()
    code = "\n".join(p.read_text() for p in (ROOT / "backends").rglob("*.py"))
    if "import flashinfer" not in code and "from flashinfer" not in code:
        assert "FlashInfer" not in text, "README promises FlashInfer kernels that no backend uses yet"
    from sglfix.cli.app import app

    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    # pytest lines show the plugin's options: they must exist there.
    plugin = (ROOT / "sglfix" / "pytest_plugin.py").read_text()
    for line in blocks.splitlines():
        if line.startswith("pytest"):
            for option in re.findall(r"(--sglfix-[a-z-]+)", line):
                assert f'"{option}"' in plugin, f"README shows pytest option {option}, which the plugin lacks"
    shell = "\n".join(line for line in blocks.splitlines() if not line.startswith("pytest"))
    used = set(re.findall(r"\bsglfix ([a-z][a-z-]*)\b", shell))
    assert used and used <= commands, f"README shows commands that do not exist: {sorted(used - commands)}"
    for group in app.registered_groups:  # sglfix report compare: the subcommand must exist too
        subs = {c.name for c in group.typer_instance.registered_commands}
        shown = set(re.findall(rf"\bsglfix {group.name} ([a-z][a-z-]*)\b", shell))
        assert shown <= subs, f"README shows sglfix {group.name} subcommands that do not exist: {sorted(shown - subs)}"
    cli_source = "\n".join(p.read_text() for p in (ROOT / "sglfix" / "cli").glob("*.py"))
    # Options of sglfix's own command lines (pip's, ruff's and the shell's are not its to check).
    segments = [seg.strip() for seg in re.split(r"&&|\|\||[|;]", shell)]
    options_shown = {o for seg in segments if seg.startswith("sglfix") for o in re.findall(r"(--[a-z][a-z-]+)", seg)}
    assert options_shown, "no sglfix option found in the README's command lines"
    for option in options_shown:
        assert f'"{option}"' in cli_source, f"README shows option {option}, which no command has"


def test_the_sglang_profiles_sources_check_passes_as_written():
    """profiles/sglang-0.5.23/SOURCES.md's check command, as written, on the installed sglang 0.5.23
    (the folder that holds it stands for the unpacked wheel's): every check passes."""
    import shlex
    import subprocess
    import sys

    from real_sglang import clean_env, require_sglang

    text = (ROOT / "profiles" / "sglang-0.5.23" / "SOURCES.md").read_text()
    m = re.search(r"Check\b[^`]*(?:`[^`]*`[^`]*)*?`(sglfix [^`]+)`", text)
    assert m, "SOURCES.md has no check command (`sglfix ...` after 'Check')"
    argv = shlex.split(m.group(1))
    assert "./sg0523" in argv, argv
    root = str(Path(require_sglang()).parent)
    argv = [root if a == "./sg0523" else a for a in argv[1:]]
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", *argv], capture_output=True, text=True, timeout=120, cwd=ROOT, env=clean_env()
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    counts = re.search(r"(\d+)/(\d+) checks pass", r.stdout)
    assert counts and counts.group(1) == counts.group(2), r.stdout[-1000:]


def _readme_text() -> str:
    # The figures moved out of the README live in docs/ and bench/README.md: counted there too.
    return " ".join((_docs() + "\n" + (ROOT / "bench" / "README.md").read_text()).split())


def _cells(report: str) -> list:
    cells = json.loads((ROOT / report).read_text()).get("cells")
    assert isinstance(cells, list), f"the README counts cells of {report}, which holds no cells to count"
    return cells


def test_the_readme_counts_of_cells_not_reached_are_those_of_the_reports_it_cites():
    """ "N of M cells not reached" is counted from the reports the sentence cites, cell by cell."""
    text = _readme_text()
    found = list(re.finditer(r"(\d+) of (\d+) cells (?:are )?not reached", text))
    assert found, "README gives no count of cells not reached"
    for m in found:
        reports = re.findall(r"`(bench/results/[\w.-]+\.json)`", text[m.end() : m.end() + 300])
        assert reports, f"README's {m.group(0)!r} cites no report"
        for report in reports:
            cells = _cells(report)
            counted = (sum(c["verdict"] == "NOT_REACHED" for c in cells), len(cells))
            assert counted == (int(m.group(1)), int(m.group(2))), (report, counted, m.group(0))


def test_the_readme_fix_line_is_counted_from_the_report_it_cites():
    """The --apply line the README quotes: its counts of patched cells from the bench report."""
    text = _readme_text()
    m = re.search(
        r"(\d+) of (\d+) patched cell\(s\) that ran to a verdict unchanged` \(`(bench/results/[\w.-]+\.json)`; "
        r"the cells skipped here, (\d+) with the fix and (\d+) without, [^`]*`\[\.\.\. (\d+) skipped here\]`",
        text,
    )
    assert m, "README quotes no --apply line with the report it comes from"
    report = json.loads((ROOT / m.group(3)).read_text())
    meanings = report["meanings_of_patched_cells"]
    judged = sum(n for k, n in meanings.items() if k not in ("skipped", "error"))
    unchanged = judged - sum(meanings.get(k, 0) for k in ("fixed", "broken", "changed"))
    assert (int(m.group(1)), int(m.group(2))) == (unchanged, judged), meanings
    every = int(re.search(r"(\d+) skipped here\]", report["outcome"]).group(1))  # every cell of the run
    skipped = meanings.get("skipped", 0)
    assert [int(m.group(i)) for i in (4, 5, 6)] == [skipped, every - skipped, every], (meanings, report["outcome"])
