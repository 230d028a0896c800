"""Toggle registry, ids and parts, env toggle parsing, and the CLI verbs on fixture toggles."""

from __future__ import annotations

import json

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli
from patch_fixtures import targets as T

from sglfix.common.errors import ConfigError, PatchStateError
from sglfix.toggling.env import maybe_revert_pr_fix, parse_env_value
from sglfix.toggling.registry import load_registry
from sglfix.toggling.revert import revert, reverted_ids

M = "patch_fixtures.targets"
ALLOW = ["--allow-target", "patch_fixtures"]

TOGGLE_PARTS = f"""\
pr: 11111
title: Scale and double fixes
url: https://example.invalid/pr/11111
bug: arithmetic
parts:
  scale:
    summary: scale by SCALE
    patches:
      - target: {M}.plain
        edits:
          - match: |
              total = total * SCALE
            replacement: |
              total = total * 1
  double:
    summary: double means times two
    patches:
      - target: {M}.Child.double
        edits:
          - match: return x * 2
            replacement: return x * 3
expect:
  - {{scenario: none-*, verdict: [DIVERGE], revert: "11111:scale"}}
"""

TOGGLE_PLAIN = f"""\
pr: 22222
title: Greeting fix
patches:
  - target: {M}.Child.greet
    edits:
      - match: |
          word = super().greet()
        replacement: |
          word = "zero"
"""

DRIFTED = f"""\
pr: 33333
title: Drifted
patches:
  - target: {M}.plain
    edits:
      - match: |
          total = total * SCALE_OLD
        replacement: |
          total = 0
"""


@pytest.fixture
def reg_dir(toggles_dir):
    (toggles_dir / "11111.yaml").write_text(TOGGLE_PARTS)
    (toggles_dir / "22222.yaml").write_text(TOGGLE_PLAIN)
    return toggles_dir


def test_ids_and_parts(reg_dir):
    reg = load_registry()
    assert reg.ids() == ["11111", "11111:scale", "11111:double", "22222", "22222:main"]
    t = reg.toggles[11111]
    assert t.expect[0].revert == ("11111:scale",) and t.expect[0].verdicts == ("DIVERGE",)


def test_revert_whole_and_part_and_twice(reg_dir):
    with revert(["11111:scale"], allowed_prefixes=("patch_fixtures",)):
        assert T.plain(1) == 3 and T.Child.double(1) == 2
        with pytest.raises(PatchStateError, match="already reverted"):
            revert(["11111"], allowed_prefixes=("patch_fixtures",))
        assert T.plain(1) == 3 and T.Child.double(1) == 2  # the refused revert applied nothing
    with revert(["11111", "22222"], allowed_prefixes=("patch_fixtures",)) as r:
        assert T.plain(1) == 3 and T.Child.double(1) == 3 and T.Child().greet() == "zero-child"
        assert sorted(reverted_ids()) == sorted(r.ids)
    assert T.plain(1) == 9 and T.Child.double(1) == 2 and T.Child().greet() == "base-child"
    assert reverted_ids() == []


def test_overlapping_ids_are_an_error(reg_dir):
    with pytest.raises(ConfigError, match="again"):
        revert(["11111", "11111:scale"], allowed_prefixes=("patch_fixtures",))


def test_env_applies_a_list_and_is_idempotent(reg_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "22222,11111:double")
    held = maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    try:
        assert T.Child.double(2) == 6 and T.Child().greet() == "zero-child" and T.plain(1) == 9
        assert maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",)) is held
        monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "11111")
        with pytest.raises(ConfigError, match="already reverted"):
            maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    finally:
        held.restore()
    assert T.Child.double(2) == 4


@pytest.mark.parametrize("value", ["", "0", "  ", " 0 "])
def test_env_none(reg_dir, value):
    assert parse_env_value(value) == []


BAD_ENV = {
    "abc": "'abc'",
    "27460,": "empty",
    "-1": "'-1'",
    "27460::x": "'27460::x'",
    "1e3": "'1e3'",
    "99999": "not registered",
    "\uff12\uff17\uff14\uff16\uff10": "bad item",
    "1" * 10000: "10000 characters",
    "11111:nope": "no part 'nope'",
    "11111,11111": "again",
    "0,11111": "0 means",
    "11111;22222": "bad item",
    "0x10": "bad item",
    "011111": "bad item",
    ",": "empty",
}


@pytest.mark.parametrize("value", list(BAD_ENV), ids=[repr(v[:12]) for v in BAD_ENV])
def test_bad_env_values_one_line_exit_2_nothing_applied(reg_dir, value):
    result = run_cli("env", env={"SGLANG_DEBUG_REVERT_PR": value})
    line = assert_one_line_error(result, "SGLANG_DEBUG_REVERT_PR", BAD_ENV[value])
    assert "11111" in line and "22222" in line  # lists the registered ids
    assert len(line) < 400
    with pytest.raises(ConfigError):
        parse_env_value(value)


def test_bad_env_in_process_applies_nothing(reg_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "22222,abc")
    before = T.Child.greet.__code__
    with pytest.raises(ConfigError):
        maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    assert T.Child.greet.__code__ is before and reverted_ids() == []


def test_cli_list_show_env_doctor(reg_dir):
    r = run_cli("list", "--json")
    assert r.code == 0
    data = json.loads(r.out)
    assert [t["id"] for t in data["toggles"]] == ["11111", "22222"]
    assert data["toggles"][0]["parts"] == ["scale", "double"]

    r = run_cli(*ALLOW, "show", "11111:scale", "--diff")
    assert r.code == 0, r.err
    assert "-    total = total * SCALE" in r.out and "+    total = total * 1" in r.out
    assert "return x * 3" not in r.out  # only the selected part
    r = run_cli(*ALLOW, "show", "11111", "--json", "--diff")
    shown = json.loads(r.out)
    assert set(shown["diff"]) == {f"{M}.plain", f"{M}.Child.double"}

    r = run_cli("env", "--json", env={"SGLANG_DEBUG_REVERT_PR": "11111:double"})
    assert r.code == 0 and [s["id"] for s in json.loads(r.out)["selected"]] == ["11111:double"]

    r = run_cli(*ALLOW, "doctor", "--json")
    # The --toggles directory's expectations are checked too: "none-*" names no built-in scenario.
    assert r.code == 1, r.out + r.err
    data = json.loads(r.out)
    assert [t["id"] for t in data["toggles"]] == ["11111", "11111:scale", "11111:double", "22222", "11111 expect"]
    assert [t["ok"] for t in data["toggles"]] == [True, True, True, True, False]
    assert "expect names no scenario: 'none-*'" in data["toggles"][-1]["error"]
    assert data["expectations_checked"] == 1 and "built-in scenarios" in data["expectations_against"]
    text = run_cli(*ALLOW, "doctor")
    assert text.code == 1 and "each of 1 expectation(s) checked against the" in text.out


def test_doctor_live_and_static_report_drift(reg_dir):
    (reg_dir / "33333.yaml").write_text(DRIFTED)
    r = run_cli(*ALLOW, "doctor")
    assert r.code == 1
    assert "DRIFTED 33333" in r.out and "SCALE_OLD" in r.out and "targets.py:" in r.out
    import patch_fixtures

    root = str(__import__("pathlib").Path(patch_fixtures.__file__).parent.parent)
    r = run_cli("doctor", "--source", root, "--toggles", str(reg_dir), "--json")
    assert r.code == 1
    rows = {t["id"]: t for t in json.loads(r.out)["toggles"]}
    assert not rows["33333"]["ok"] and rows["11111"]["ok"] and rows["22222"]["ok"]
    live = run_cli(*ALLOW, "doctor", "--json")
    live_rows = {t["id"]: t for t in json.loads(live.out)["toggles"]}
    # Same rule, same message: the static error names the same edit and closest window.
    assert rows["33333"]["error"].splitlines()[0] == live_rows["33333"]["error"].splitlines()[0]


def test_unknown_command_and_option_exit_2(reg_dir):
    assert_one_line_error(run_cli("frobnicate"), "frobnicate")
    assert_one_line_error(run_cli("list", "--jsn"), "--jsn")
    assert_one_line_error(run_cli("show", "nope"), "'nope'")
    assert_one_line_error(run_cli("show", "11111:scal"), "did you mean 'scale'")
    assert_one_line_error(run_cli("doctor", "--source", "/nonexistent/dir"), "/nonexistent/dir")
    assert_one_line_error(run_cli("--toggles", "/nonexistent/t", "list"), "/nonexistent/t")


def test_debug_shows_a_traceback(reg_dir):
    r = run_cli("--debug", "show", "nope")
    assert r.code == 2 and "Traceback" in r.err


def test_builtin_caught_by_entries_name_real_tests():
    """A toggle's caught_by list must point at tests that exist, or it records nothing."""
    import ast

    root = ROOT
    for toggle in load_registry(root / "toggles"):
        assert toggle.caught_by, f"{toggle.id} records no test that catches its revert"
        for item in toggle.caught_by:
            path, _, name = item.split("[")[0].partition("::")
            tree = ast.parse((root / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"{toggle.id}: caught_by {item} names no test"


# --------------------------------------------------------------------------- one id grammar

STACKED = f"""\
pr: 44444
title: Stacked on 11111:scale
patches:
  - target: {M}.plain
    edits:
      - match: |
          total = total * 1
        replacement: |
          total = total * 7
"""


@pytest.mark.parametrize(
    "token,ok",
    [
        ("11111", True),
        ("11111:scale", True),
        (" 11111:double ", True),
        ("", False),
        ("0", False),
        ("011111", False),
        ("1234567890", False),
        ("11111:", False),
        ("11111:Scale", False),
        ("11111::scale", False),
        ("-1", False),
        ("1e3", False),
        ("11111:9x", False),
    ],
)
def test_one_grammar_for_every_reader_of_an_id(reg_dir, token, ok):
    """The registry, the env variable, the CLI and a toggle file's expect agree on what an id is."""
    from sglfix.toggling.ids import ToggleId
    from sglfix.toggling.registry import parse_toggle

    def accepted(read) -> bool:
        try:
            read()
        except ConfigError as exc:
            assert len(str(exc).splitlines()) == 1
            return False
        return True

    assert accepted(lambda: ToggleId.parse(token)) is ok
    assert accepted(lambda: load_registry().select(token)) is ok
    if token.strip() not in ("", "0"):  # empty or 0 in the variable means "none"
        assert accepted(lambda: parse_env_value(token)) is ok
    body = TOGGLE_PARTS.replace('revert: "11111:scale"', f"revert: {token!r}")
    assert accepted(lambda: parse_toggle(body, path="11111.yaml")) is ok
    if ok:
        assert str(ToggleId.parse(token)) == token.strip()


def test_malformed_id_reads_the_same_in_the_env_as_any_other_bad_item(reg_dir):
    # A ten-digit number used to pass the variable's own pattern, then fail the registry's.
    with pytest.raises(ConfigError, match=r"bad item '1234567890' \(item 1\)"):
        parse_env_value("1234567890")


def test_empty_id_is_an_error_naming_the_option_never_nothing(reg_dir):
    from sglfix.toggling.ids import ToggleId
    from sglfix.toggling.registry import parse_toggle_ids

    for tokens in ([""], ["11111", " "]):
        with pytest.raises(ConfigError, match=r"^--revert: empty toggle id"):
            parse_toggle_ids(tokens, registry=load_registry(), what="--revert")
    with pytest.raises(ConfigError, match=r"^--revert: empty toggle id"):
        ToggleId.parse_list(["11111,", "22222"], what="--revert")
    assert [str(i) for i in ToggleId.parse_list(["11111:scale,22222", "11111:double"], what="-r")] == [
        "11111:scale",
        "22222",
        "11111:double",
    ]
    assert_one_line_error(run_cli("show", ""), "show: empty toggle id")
    assert parse_env_value("") == [] and parse_env_value("0") == []  # the variable keeps its meaning


def test_expect_ids_must_name_registered_toggles(reg_dir):
    (reg_dir / "22222.yaml").write_text(TOGGLE_PLAIN + "expect:\n  - {scenario: s, verdict: PASS, revert: '99999'}\n")
    with pytest.raises(ConfigError, match=r"22222.yaml:11: expect\[0\]\.revert: PR 99999 is not registered"):
        load_registry()


# --------------------------------------------------------------------------- restore: all or nothing


def test_restore_under_a_stacked_set_changes_nothing_and_the_record_stays_true(reg_dir):
    (reg_dir / "44444.yaml").write_text(STACKED)
    a = revert(["11111"], allowed_prefixes=("patch_fixtures",))
    b = revert(["44444"], allowed_prefixes=("patch_fixtures",))
    assert T.plain(1) == 21 and T.Child.double(1) == 3
    with pytest.raises(
        PatchStateError, match=r"cannot restore 11111:scale,11111:double: revert 44444:main .*restore 44444:main first"
    ):
        a.restore()
    # Nothing moved: before, Child.double came back while 11111 stayed listed as reverted.
    assert T.plain(1) == 21 and T.Child.double(1) == 3
    assert reverted_ids() == ["11111:scale", "11111:double", "44444:main"] and not a.restored
    b.restore()
    assert reverted_ids() == ["11111:scale", "11111:double"] and T.plain(1) == 3
    a.restore()
    assert reverted_ids() == [] and T.plain(1) == 9 and T.Child.double(1) == 2


def test_record_follows_states_restored_behind_its_back(reg_dir):
    held = revert(["22222"], allowed_prefixes=("patch_fixtures",))
    for state in held.states:
        state.restore()
    assert reverted_ids() == [] and held.restored


# --------------------------------------------------------------------------- side effects never leak

STATEFUL = "patch_fixtures.stateful"
SIDE_EFFECTS = f"""\
pr: 55555
title: Reverted code that changes module state when it runs
parts:
  rebind:
    summary: rebinds a global, adds one, sets another module's attribute
    patches:
      - target: {STATEFUL}.lookup
        edits:
          - match: value = x + 1
            replacement: |
              global CACHE, MODE
              import patch_fixtures.settings as settings
              CACHE = ("reverted", x)
              MODE = "reverted"
              globals()["ADDED_BY_REVERT"] = x
              globals()["len"] = lambda *args: -1
              settings.LEVEL = 99
              value = x + 100
  imports:
    summary: imports a module for the first time
    patches:
      - target: {STATEFUL}.settle
        edits:
          - match: result = x * 2
            replacement: |
              import patch_fixtures.late
              result = x * 3
"""


@pytest.fixture
def stateful(reg_dir):
    from patch_fixtures import settings, stateful

    (reg_dir / "55555.yaml").write_text(SIDE_EFFECTS)
    before = (stateful.CACHE, stateful.MODE, settings.LEVEL)
    yield stateful, settings
    assert before == (stateful.CACHE, stateful.MODE, settings.LEVEL)


def test_restore_undoes_module_state_the_reverted_code_changed(stateful):
    mod, settings = stateful
    with revert(["55555:rebind"], allowed_prefixes=("patch_fixtures",)):
        assert mod.lookup(1) == 101
        assert mod.CACHE == ("reverted", 1) and mod.MODE == "reverted" and settings.LEVEL == 99
        assert mod.ADDED_BY_REVERT == 1 and "len" in vars(mod)
    assert mod.lookup(1) == 2
    assert mod.CACHE is None and mod.MODE == "fixed" and settings.LEVEL == 1
    # A name that shadows a builtin is removed; other added names stay (runtimes such as the
    # Triton interpreter bind helpers into a module on its first run).
    assert "len" not in vars(mod)


def test_env_revert_restores_module_state_too(stateful, monkeypatch):
    mod, settings = stateful
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "55555:rebind")
    held = maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    mod.lookup(2)
    assert settings.LEVEL == 99
    held.restore()
    assert mod.CACHE is None and settings.LEVEL == 1 and "len" not in vars(mod)


def test_a_set_restored_under_a_newer_one_hands_its_module_state_over(stateful):
    mod, settings = stateful
    older = revert(["55555:rebind"], allowed_prefixes=("patch_fixtures",))
    mod.lookup(3)
    newer = revert(["22222"], allowed_prefixes=("patch_fixtures",))
    older.restore()  # disjoint functions: allowed; the newer set now restores to the older point
    assert mod.lookup(3) == 4 and reverted_ids() == ["22222:main"]
    newer.restore()
    assert mod.CACHE is None and mod.MODE == "fixed" and settings.LEVEL == 1
    assert "len" not in vars(mod)


def test_a_module_imported_by_reverted_code_stays_importable(stateful):
    import sys

    import patch_fixtures

    sys.modules.pop("patch_fixtures.late", None)
    patch_fixtures.__dict__.pop("late", None)
    try:
        with revert(["55555:imports"], allowed_prefixes=("patch_fixtures",)):
            assert stateful[0].settle(2) == 6
        assert stateful[0].settle(2) == 4
        assert patch_fixtures.late.READY and sys.modules["patch_fixtures.late"] is patch_fixtures.late
    finally:
        sys.modules.pop("patch_fixtures.late", None)
        patch_fixtures.__dict__.pop("late", None)


# --------------------------------------------------------------------------- toggles directory and files


def test_toggles_directory_problems_say_which(tmp_path, monkeypatch):
    from sglfix.toggling import registry as reg

    with pytest.raises(ConfigError, match=r"toggles directory .*/missing does not exist"):
        load_registry(tmp_path / "missing")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"toggles directory .*/plain.txt is a file, not a directory"):
        load_registry(tmp_path / "plain.txt")
    locked = tmp_path / "locked"
    locked.mkdir()

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    # Tests may run as root, for whom chmod 000 still reads: refuse the listing itself.
    monkeypatch.setattr(reg.Path, "iterdir", denied)
    with pytest.raises(ConfigError, match=r"toggles directory .*/locked is not readable \(permission denied\)"):
        load_registry(locked)
    assert_one_line_error(run_cli("--toggles", str(tmp_path / "plain.txt"), "list"), "is a file, not a directory")


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"pr: 44444\ntitle: caf\xe9\n", "44444.yaml:2: not UTF-8"),
        (b"pr: 44444\x00\ntitle: t\n", "44444.yaml is binary"),
    ],
)
def test_unreadable_toggle_file_is_one_line_naming_it(toggles_dir, content, needle):
    (toggles_dir / "44444.yaml").write_bytes(content)
    line = assert_one_line_error(run_cli("list"), "toggle file", needle)
    assert "internal error" not in line
    with pytest.raises(ConfigError, match="toggle file"):
        load_registry()


def test_the_public_env_entry_point_imports_nothing_when_unset_and_validates_when_set():
    """Engines call sglfix.maybe_revert_pr_fix() in every process: unset or 0 it must cost
    nothing (no YAML, registry or pydantic import); set, it is the full, validating call."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys, sglfix\nr = sglfix.maybe_revert_pr_fix()\n"
        "print(r, sorted(m for m in ('yaml', 'pydantic', 'inspect', 'sglfix.toggling.env', 'torch') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DEBUG_REVERT_PR"}
    for value in (None, "0", " "):
        run_env = env if value is None else {**env, "SGLANG_DEBUG_REVERT_PR": value}
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "None []", (value, out.stdout, out.stderr)
    bad = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "SGLANG_DEBUG_REVERT_PR": "abc"},
    )
    assert bad.returncode != 0 and "SGLANG_DEBUG_REVERT_PR: bad item 'abc'" in bad.stderr


def test_toggle_files_in_the_working_directory_that_differ_from_those_in_use_are_named(tmp_path, monkeypatch, capsys):
    """After a regular ``pip install .`` the registry reads the installed copy of the toggle files:
    a toggle edited in the checkout's ./toggles would be ignored. One line names each file that
    differs (edited, new, missing here) and --toggles; the same files say nothing."""
    import shutil

    from sglfix.cli import context

    root = ROOT / "toggles"
    installed = tmp_path / "site-packages" / "sglfix" / "toggles"
    shutil.copytree(root, installed)
    checkout = tmp_path / "checkout"
    shutil.copytree(root, checkout / "toggles")
    monkeypatch.chdir(checkout)
    for name in ("SGLFIX_TOGGLES_DIR", "SGLFIX_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sglfix.toggling.registry.default_toggles_dir", lambda: str(installed))

    def note() -> list[str]:
        monkeypatch.setattr(context, "_NOTED", set())
        context.Options().registry()
        return [line for line in capsys.readouterr().err.splitlines() if line.strip()]

    assert note() == []  # the same files: nothing to say
    edited = checkout / "toggles" / "27460.yaml"
    edited.write_text(edited.read_text().replace("title:", "title: (edited)", 1))
    lines = note()
    assert len(lines) == 1 and "27460.yaml edited" in lines[0] and "--toggles toggles" in lines[0], lines
    assert str(installed) in lines[0] and "26651" not in lines[0]
    (checkout / "toggles" / "26651.yaml").unlink()
    shutil.copy(installed / "26738.yaml", checkout / "toggles" / "99999.yaml")
    (lines,) = note()
    assert "27460.yaml edited; 99999.yaml new; 26651.yaml missing here;" in lines
