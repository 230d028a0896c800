"""Every YAML and command block of the README and of docs/ works as written: a scenario loads, a
workflow parses, and every ``sglfix`` and ``pytest`` command names a command and options that exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import yaml
from builders import ROOT

from sglfix.cli.app import LINE_FLAGS

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [block for page in PAGES for block in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)]


def _blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == kind]


def test_the_readme_has_the_blocks_these_tests_read():
    assert len(_blocks("yaml")) >= 3 and len(_blocks("bash")) >= 8


@pytest.mark.parametrize("index", range(len(_blocks("yaml"))))
def test_each_yaml_block_is_valid_as_what_it_shows(tmp_path, index):
    from sglfix.scenario import load_scenarios

    text = _blocks("yaml")[index]
    data = yaml.safe_load(text)
    assert isinstance(data, dict), text
    if "mode" in data and "backend" in data:  # a scenario file, copied verbatim
        path = tmp_path / "scenario.yaml"
        path.write_text(text)
        loaded = load_scenarios([str(path)], builtin=False)
        assert loaded and all(s.name.startswith(data["name"]) for s in loaded)
    elif "jobs" in data:  # a CI workflow: every command it runs must exist
        runs = [step["run"] for job in data["jobs"].values() for step in job.get("steps", []) if "run" in step]
        assert runs
        for run in runs:
            for segment in _commands(run.replace("${{ matrix.shard }}", "1")):
                _check_command(segment)
    else:
        pytest.fail(f"a YAML block of the README or docs/ that no test reads: {text[:200]}")


def _commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at && ; |), comments dropped, ``sh -c`` opened."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, current = [], []
    for tok in tokens + [";"]:
        if tok in ("&&", ";", "|", "||"):
            if current:
                at = next((i for i in range(len(current) - 2) if current[i : i + 2] == ["sh", "-c"]), None)
                if at is not None:  # git bisect run sh -c '...': the commands inside
                    out += [c for part in re.split(r";|&&", current[at + 2]) for c in _commands(part)]
                else:
                    out.append(current)
            current = []
        else:
            current.append(tok)
    return out


def _synopsis_tokens(tokens: list[str]) -> list[str]:
    """Tokens of a usage line with its optional brackets and separators stripped."""
    return [t.strip("[]()") for t in tokens if t.strip("[]()|") and t not in ("...",)]


_ROOT_CMD = None


def _root():
    global _ROOT_CMD
    if _ROOT_CMD is None:
        from typer.main import get_command

        from sglfix.cli.app import app

        _ROOT_CMD = get_command(app)
    return _ROOT_CMD


def _options(cmd) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


def _check_command(tokens: list[str]) -> None:
    while tokens and re.match(r"^[A-Z_]+=", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    if not tokens:
        return
    if tokens[0] == "sglfix":
        _check_sglfix(_synopsis_tokens(tokens[1:]))
    elif tokens[0] == "pytest":
        _check_pytest(_synopsis_tokens(tokens[1:]))


def _check_sglfix(args: list[str]) -> None:
    root = _root()
    global_opts = _options(root)
    cmd, path, rest = root, ["sglfix"], list(args)
    while hasattr(cmd, "commands"):  # a group (typer may vendor its own click: no isinstance)
        # Global options (and their values) may come first.
        while rest and rest[0].startswith("-"):
            opt = rest.pop(0).split("=", 1)[0]
            assert opt in global_opts | set(LINE_FLAGS), f"{' '.join(path)}: no global option {opt}"
            param = next((p for p in root.params if opt in p.opts), None)
            if param is not None and not getattr(param, "is_flag", False) and rest and "=" not in opt:
                rest.pop(0)
        assert rest, f"{' '.join(path)}: no command named"
        name = rest.pop(0)
        sub = cmd.commands.get(name)
        assert sub is not None, f"{' '.join(path)} has no command {name!r} (has {', '.join(sorted(cmd.commands))})"
        cmd, path = sub, path + [name]
    allowed = _options(cmd) | global_opts | set(LINE_FLAGS)
    for tok in rest:
        if tok.startswith("-") and tok not in ("-",) and not re.match(r"^-\d", tok):
            opt = tok.split("=", 1)[0].rstrip(",")
            assert opt in allowed, f"{' '.join(path)} has no option {opt} (has {', '.join(sorted(allowed))})"


_PYTEST_HELP = None


def _check_pytest(args: list[str]) -> None:
    global _PYTEST_HELP
    if _PYTEST_HELP is None:
        _PYTEST_HELP = subprocess.run(
            [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        ).stdout
    for tok in args:
        if tok.startswith("-"):
            opt = tok.split("=", 1)[0]
            assert re.search(rf"(^|[\s,]){re.escape(opt)}([\s,=]|$)", _PYTEST_HELP, re.M), f"pytest has no option {opt}"


@pytest.mark.parametrize("index", range(len(_blocks("bash"))))
def test_each_command_block_names_commands_and_options_that_exist(index):
    text = _blocks("bash")[index]
    checked = 0
    for line in text.splitlines():
        for segment in _commands(line):
            _check_command(segment)
            checked += segment[:1] in (["sglfix"], ["pytest"]) or any(t == "sglfix" for t in segment[:3])
    if re.search(r"^\s*([A-Z_]+=\S+\s+)*(sglfix|pytest)\s|sh -c '\s*(sglfix|pytest)\s", text, re.M):
        assert checked, text


def test_the_checker_catches_a_wrong_option_and_a_wrong_command():
    with pytest.raises(AssertionError, match="has no option --jsn"):
        _check_sglfix(["run", "--jsn", "x"])
    with pytest.raises(AssertionError, match="has no command 'frobnicate'"):
        _check_sglfix(["frobnicate"])
    with pytest.raises(AssertionError, match="has no command 'merg'"):
        _check_sglfix(["report", "merg", "a.json"])
    _check_sglfix(["--profile", "sglang-0.5.23", "matrix", "--parts", "--device", "cpu"])
    with pytest.raises(AssertionError, match="pytest has no option --sglfix-check-fix"):
        _check_pytest(["--sglfix-check-fix"])
