"""The installed start-up hook: SGLANG_DEBUG_REVERT_PR takes effect in every process, no program change.

Each test starts real interpreters of this environment (where sglfix is installed, so its
``zz-sglfix-startup.pth`` runs at start-up) and changes nothing in the programs they run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from builders import ROOT

OVERLAP = "sglfix.backends.srt.managers.overlap_utils"
# The pre-fix decide_needs_cpu_seq_lens reads the flag on a None backend: AttributeError.
PROBE = textwrap.dedent(f"""
    import {OVERLAP} as m
    try:
        print("fixed" if m.decide_needs_cpu_seq_lens([None]) is False else "odd")
    except AttributeError:
        print("pre-fix")
""")
HEAVY = ("yaml", "torch", "rich", "typer", "pydantic", "inspect", "ast")


def _env(**extra: str) -> dict[str, str]:
    # PYTHONUNBUFFERED goes too: the programs' stdout is then block-buffered, as in a plain CI pipe.
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "SGLANG_DEBUG_REVERT_PR",
            "SGLFIX_PROFILE",
            "SGLFIX_TOGGLES_DIR",
            "SGLFIX_VERBOSE",
            "PYTHONPATH",
            "PYTHONUNBUFFERED",
        )
    }
    env.update(extra)
    return env


def _py(code: str, *, env: dict[str, str], cwd: str | Path | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def test_the_hook_is_installed_next_to_the_packages_and_is_the_checkout_file():
    site = Path(sysconfig.get_paths()["purelib"])
    installed = site / "zz-sglfix-startup.pth"
    assert installed.is_file(), f"{installed} missing: reinstall sglfix (pip install -e .)"
    assert installed.read_bytes() == (ROOT / "zz-sglfix-startup.pth").read_bytes()
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", "env", "--json"], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout)["startup_hook"] == str(installed)


@pytest.mark.parametrize("value", [None, "", "0", " 0 ", "  ", "26738", "0,1", "x"])
def test_the_pth_line_selects_nothing_exactly_when_the_package_rule_does(value):
    # The line cannot import the rule (that would cost every interpreter start): it repeats it.
    from sglfix.toggling import selects_nothing

    line = (ROOT / "zz-sglfix-startup.pth").read_text().strip()
    condition = line.split(";", 1)[1].split(" or exec(")[0].strip()
    environ = {} if value is None else {"SGLANG_DEBUG_REVERT_PR": value}
    assert eval(condition, {"os": type("os", (), {"environ": environ})}) == selects_nothing(value)


def test_unset_the_hook_imports_nothing_and_the_program_runs_unpatched(tmp_path):
    for env in (_env(), _env(SGLANG_DEBUG_REVERT_PR="0"), _env(SGLANG_DEBUG_REVERT_PR="")):
        r = _py("import sys; print(sorted(sys.modules))", env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        loaded = eval(r.stdout)
        assert not [m for m in loaded if m.startswith("sglfix") or m.split(".")[0] in HEAVY], loaded
        timing = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        ).stderr
        names = [line.rsplit("|", 1)[-1].strip() for line in timing.splitlines() if "|" in line]
        assert not [n for n in names if n.startswith("sglfix") or n.split(".")[0] in HEAVY], names
    assert _py(PROBE, env=_env(), cwd=tmp_path).stdout.strip() == "fixed"


def test_set_the_program_runs_the_pre_fix_code_in_the_process_and_in_its_children(tmp_path):
    child = textwrap.dedent(f"""
        import subprocess, sys, multiprocessing as mp

        def probe(q):
            import {OVERLAP} as m
            try:
                m.decide_needs_cpu_seq_lens([None]); q.put("fixed")
            except AttributeError:
                q.put("pre-fix")

        if __name__ == "__main__":
            exec({PROBE!r})
            out = subprocess.run([sys.executable, "-c", {PROBE!r}], stdout=subprocess.PIPE, text=True).stdout
            print("child:", out.strip())
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=probe, args=(q,))
            p.start(); print("spawn:", q.get(timeout=120)); p.join()
            import sglfix
            print("ids:", ",".join(sglfix.reverted_ids()))
    """)
    script = tmp_path / "engine.py"
    script.write_text(child)
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=_env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard", SGLFIX_VERBOSE="1"),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:4] == ["pre-fix", "child: pre-fix", "spawn: pre-fix", "ids: 26738:overlap-guard"], r.stdout
    logged = [line for line in r.stderr.splitlines() if "reverted 26738:overlap-guard" in line]
    assert len({line.split("]")[0] for line in logged}) == 3, r.stderr  # three processes, one line each


def test_a_bad_value_is_one_line_and_exit_2_before_the_program_runs(tmp_path):
    for value, needle in (
        ("26738:overlap", "did you mean 'overlap-guard'"),
        ("27460x", "bad item"),
        ("12345", "not registered"),
        ("26651,,26738", "empty"),
    ):
        r = _py("print('the program ran')", env=_env(SGLANG_DEBUG_REVERT_PR=value), cwd=tmp_path)
        assert r.returncode == 2, (value, r.stdout, r.stderr)
        assert "the program ran" not in r.stdout
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "SGLANG_DEBUG_REVERT_PR" in lines[0] and needle in lines[0], (value, lines)
    r = _py("print('ran')", env=_env(SGLANG_DEBUG_REVERT_PR="26738", SGLFIX_PROFILE="sglang-0.5.2"), cwd=tmp_path)
    assert r.returncode == 2 and "SGLFIX_PROFILE" in r.stderr and "sglang-0.5.23" in r.stderr, r.stderr
    assert "ran" not in r.stdout


def test_already_imported_targets_are_reverted_at_once_and_an_explicit_call_is_idempotent(tmp_path):
    code = textwrap.dedent(f"""
        import {OVERLAP} as m
        from sglfix.toggling import hook
        import sglfix
        state = hook.arm("26738:overlap-guard")
        try:
            m.decide_needs_cpu_seq_lens([None]); print("fixed")
        except AttributeError:
            print("pre-fix")
        again = sglfix.maybe_revert_pr_fix()
        print(again is state.record, ",".join(sglfix.reverted_ids()))
    """)
    r = _py(code, env=_env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pre-fix", "True", "26738:overlap-guard"]


def test_sglfix_own_command_line_reads_the_variable_itself(tmp_path):
    # The CLI hands the selection to each cell's worker; the hook must not also act in it
    # (nor validate against another toggle directory than --toggles names).
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", "env", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "sglfix.toggling.hook" not in r.stderr


# --------------------------------------------------------------------------- real sglang's shape


STUB_TOGGLE = """\
pr: {pr}
title: stub fix {pr}
patches:
  - target: sglang.srt.managers.{module}.{function}
    edits:
      - match: |
          return "fixed"
        replacement: |
          return "reverted"
"""


def _stub_sglang(root: Path) -> Path:
    """sglang's import shape: the scheduler binds maybe_revert_pr_fix by name at import and calls
    it in Scheduler.__init__; sglang's reader takes one int and applies its own revert."""
    files = {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/debug_utils/__init__.py": "",
        "sglang/srt/debug_utils/pr_fix_toggle.py": """\
            import os
            APPLIED = []

            def maybe_revert_pr_fix() -> None:
                if pr_num := int(os.environ.get("SGLANG_DEBUG_REVERT_PR") or 0):
                    _revert_pr_fix(pr_num)

            def _revert_pr_fix(pr_num):
                APPLIED.append(pr_num)
                raise RuntimeError(f"sglang's own revert of {pr_num} no longer applies")
            """,
        "sglang/srt/managers/__init__.py": "",
        "sglang/srt/managers/overlap.py": """\
            def decide():
                return "fixed"
            """,
        "sglang/srt/managers/scheduler.py": """\
            from sglang.srt.debug_utils.pr_fix_toggle import maybe_revert_pr_fix
            from sglang.srt.managers.overlap import decide

            class Scheduler:
                def __init__(self):
                    maybe_revert_pr_fix()
                    self.decision = decide()

                def plan(self):
                    return "fixed"
            """,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    toggles = root / "toggles"
    toggles.mkdir()
    (toggles / "11111.yaml").write_text(STUB_TOGGLE.format(pr=11111, module="overlap", function="decide"))
    (toggles / "22222.yaml").write_text(STUB_TOGGLE.format(pr=22222, module="scheduler", function="Scheduler.plan"))
    return toggles


@pytest.mark.parametrize("value", ["11111,22222", "11111"])
def test_sglang_own_reader_bound_into_the_scheduler_neither_reapplies_nor_crashes(tmp_path, value):
    toggles = _stub_sglang(tmp_path)
    code = textwrap.dedent("""
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.debug_utils import pr_fix_toggle
        s = Scheduler()
        print(s.decision, s.plan(), pr_fix_toggle.APPLIED)
    """)
    env = _env(
        SGLANG_DEBUG_REVERT_PR=value,
        SGLFIX_PROFILE="sglang-0.5.23",
        SGLFIX_TOGGLES_DIR=str(toggles),
        PYTHONPATH=str(tmp_path),
        SGLFIX_VERBOSE="1",
    )
    r = _py(code, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = "reverted" if "22222" in value else "fixed"
    assert r.stdout.split() == ["reverted", plan, "[]"], r.stdout
    assert "pr_fix_toggle.maybe_revert_pr_fix silenced" in r.stderr
    # Under any profile sglfix applies the variable with, sglang's reader stays silent: here the
    # reproduction's, with an id sglang's reader would choke on.
    repro = {**env, "SGLFIX_PROFILE": "reproduction", "SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard"}
    repro.pop("SGLFIX_TOGGLES_DIR")
    r = _py(code, env=repro, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fixed", "fixed", "[]"], r.stdout
    assert "pr_fix_toggle.maybe_revert_pr_fix silenced" in r.stderr
    # Without the start-up hook (-S: no .pth runs) sglang's own reader runs, so the checks above can fail.
    r = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r.returncode != 0
    assert ("invalid literal for int()" if "," in value else "no longer applies") in r.stderr


@pytest.mark.parametrize(
    "module_text, needles",
    [
        # The target is there, its match text is not.
        (
            "def decide():\n    return 'refactored'\n",
            ["revert 11111", "cannot be applied to sglang.srt.managers.overlap.decide"],
        ),
        # The module arrives without the target at all: an error, not a wait for a later import.
        (
            "def decide_renamed():\n    return 'fixed'\n",
            ["revert 11111:main is not in effect", "sglang.srt.managers.overlap.decide is not there to revert"],
        ),
    ],
)
def test_a_revert_that_cannot_go_in_when_its_module_arrives_stops_the_process(tmp_path, module_text, needles):
    toggles = _stub_sglang(tmp_path)
    (tmp_path / "sglang/srt/managers/overlap.py").write_text(module_text)
    env = _env(
        SGLANG_DEBUG_REVERT_PR="11111",
        SGLFIX_PROFILE="sglang-0.5.23",
        SGLFIX_TOGGLES_DIR=str(toggles),
        PYTHONPATH=str(tmp_path),
    )
    r = _py("print('start')\nimport sglang.srt.managers.overlap\nprint('unpatched run')", env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout.split() == ["start"]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines


def test_torchrun_ranks_each_run_the_pre_fix_code(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(
        textwrap.dedent(f"""
        import os
        import sglfix
        import {OVERLAP} as m
        try:
            m.decide_needs_cpu_seq_lens([None]); state = "fixed"
        except AttributeError:
            state = "pre-fix"
        # One file per rank: the ranks share the launcher's stdout, where their lines can interleave.
        with open(f"rank-{{os.environ['RANK']}}.txt", "w") as fh:
            fh.write(f"rank {{os.environ['RANK']}}: {{state}} {{','.join(sglfix.reverted_ids())}}")
    """)
    )
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=_env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard", OMP_NUM_THREADS="1"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ranks = sorted(p.read_text() for p in tmp_path.glob("rank-*.txt"))
    assert ranks == ["rank 0: pre-fix 26738:overlap-guard", "rank 1: pre-fix 26738:overlap-guard"], r.stdout


def test_a_set_process_reads_the_cache_and_imports_neither_yaml_nor_pydantic(tmp_path):
    """The second process with the variable set arms from the content-keyed cache: no YAML,
    no pydantic at start; the patches are read when the target module arrives, and it reverts."""
    env = _env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard", SGLFIX_CACHE_DIR=str(tmp_path / "cache"))
    heavy = "import sys; print(sorted(m for m in ('yaml', 'pydantic') if m in sys.modules))"
    first = _py(heavy, env=env)
    assert first.returncode == 0 and first.stdout.strip() == "['pydantic', 'yaml']", first.stdout + first.stderr
    assert list((tmp_path / "cache").glob("arm-*.json"))
    second = _py(heavy, env=env)
    assert second.returncode == 0 and second.stdout.strip() == "[]", second.stdout + second.stderr
    probe = _py(PROBE + "\nimport sglfix\nprint(','.join(sglfix.reverted_ids()))\n", env=env)
    assert probe.stdout.split() == ["pre-fix", "26738:overlap-guard"], probe.stdout + probe.stderr
    # A value the cache cannot answer goes the full way, which words the error.
    bad = _py("print('ran')", env={**env, "SGLANG_DEBUG_REVERT_PR": "26738:overlap"})
    assert bad.returncode == 2 and "did you mean 'overlap-guard'" in bad.stderr and "ran" not in bad.stdout


def test_the_cache_is_never_stale(tmp_path):
    """A toggle file edited after the cache was written makes the entry miss: the process sees
    the edit (and the entry is written again). A damaged entry is ignored, never trusted."""
    import json
    import shutil

    toggles = tmp_path / "toggles"
    shutil.copytree(ROOT / "toggles", toggles)
    cache = tmp_path / "cache"
    env = _env(
        SGLANG_DEBUG_REVERT_PR="26738:overlap-guard", SGLFIX_TOGGLES_DIR=str(toggles), SGLFIX_CACHE_DIR=str(cache)
    )
    assert _py(PROBE, env=env).stdout.strip() == "pre-fix"
    (entry,) = cache.glob("arm-*.json")
    # The part now reverts nothing observable: its replacement is the fixed line itself.
    fixed = 'return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)'
    text = (toggles / "26738.yaml").read_text()
    (toggles / "26738.yaml").write_text(text.replace("return any(b.needs_cpu_seq_lens for b in attn_backends)", fixed))
    assert _py(PROBE, env=env).stdout.strip() == "fixed"
    assert fixed in json.loads(entry.read_text())["files"]["26738.yaml"]  # written again, with the edit
    entry.write_text("{not json")
    assert _py(PROBE, env=env).stdout.strip() == "fixed"
    assert json.loads(entry.read_text())["select"]  # the full way wrote it whole again
    # The part renamed: a stale entry would still accept the old id; the process refuses it.
    text = (toggles / "26738.yaml").read_text()
    (toggles / "26738.yaml").write_text(text.replace("  overlap-guard:", "  none-guard:"))
    r = _py("print('ran')", env=env)
    assert r.returncode == 2 and "26738:overlap-guard" in r.stderr and "ran" not in r.stdout, r.stderr
