"""The start-up hook in a process that imports real sglang 0.5.23, with only
``SGLANG_DEBUG_REVERT_PR`` set: the profile follows the import, the selected real functions are
reverted at import, and sglang's own reader of the variable neither re-applies nor raises."""

from __future__ import annotations

import json
import sys

from real_sglang import clean_env, require_sglang, run_python

# Which of the two observed functions run their pre-fix code, read from the live functions'
# code objects: the fixed decide_needs_cpu_seq_lens reads the flag with getattr (a constant), the
# pre-fix one as an attribute; the fixed draft-extend buffers clamp, the reverted ones do not.
PROBE = """
import json, types
import sglfix
from sglang.srt.managers import overlap_utils
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

def names(code):
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= names(c)
    return out

from sglang.srt.debug_utils.pr_fix_toggle import maybe_revert_pr_fix
error = None
try:
    maybe_revert_pr_fix()  # what Scheduler.__init__ calls
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({
    "overlap_guard_reverted": "needs_cpu_seq_lens" in names(overlap_utils.decide_needs_cpu_seq_lens.__code__),
    "clamp_reverted": "clamp" not in names(TritonAttnBackend._update_draft_extend_buffers.__code__),
    "reverted": sglfix.reverted_ids(),
    "file": overlap_utils.decide_needs_cpu_seq_lens.__code__.co_filename,
    "sglang_reader_error": error,
}))
"""


def _result(r) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_only_the_variable_set_reverts_the_real_functions_at_import_and_silences_sglangs_reader():
    path = require_sglang()
    env = clean_env(SGLANG_DEBUG_REVERT_PR="26651:clamp,26738:overlap-guard", SGLFIX_VERBOSE="1")
    got = _result(run_python(PROBE, env=env))
    assert got["overlap_guard_reverted"] and got["clamp_reverted"], got
    assert sorted(got["reverted"]) == ["26651:clamp", "26738:overlap-guard"], got  # in import order
    assert got["file"].startswith(path), got  # the real function, in place, its file kept
    assert got["sglang_reader_error"] is None, got
    r = run_python(PROBE, env=env)
    assert "profile sglang-0.5.23: SGLFIX_PROFILE is unset and this process imported sglang first" in r.stderr


def test_without_the_variable_the_same_functions_run_fixed_code():
    require_sglang()
    got = _result(run_python(PROBE, env=clean_env()))
    assert not got["overlap_guard_reverted"] and not got["clamp_reverted"] and got["reverted"] == [], got


def test_an_id_sglang_does_not_register_would_crash_its_own_reader_without_the_hook():
    """The check above can fail: with the hook not running (``-S`` skips .pth files; the
    packages are put on sys.path by hand), sglang's reader raises for 26738."""
    require_sglang()
    import site

    paths = json.dumps(site.getsitepackages() + [p for p in sys.path if p.endswith(("site-packages", "main"))])
    code = f"import sys; sys.path[:0] = {paths}\n" + PROBE.replace(
        "import sglfix\n", "import sglfix\nsglfix.reverted_ids = lambda: []\n"
    )
    got = _result(run_python(code, env=clean_env(SGLANG_DEBUG_REVERT_PR="26738"), args=("-S",)))
    assert got["sglang_reader_error"] is not None and "NotImplementedError" in got["sglang_reader_error"], got
    assert not got["overlap_guard_reverted"], got


def test_every_whole_id_of_the_profile_leaves_sglangs_reader_silent():
    require_sglang()
    for value in ("26738", "26651,27460:sizing", "25015", "27360"):
        r = run_python(
            """
            from sglang.srt.debug_utils.pr_fix_toggle import maybe_revert_pr_fix
            maybe_revert_pr_fix()
            print("ok")
        """,
            env=clean_env(SGLANG_DEBUG_REVERT_PR=value),
        )
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (value, r.stderr[-2000:])


def test_an_id_only_the_sglang_profile_has_names_SGLFIX_PROFILE_in_one_line():
    require_sglang()
    r = run_python(
        "import sglfix.backends.srt.managers.overlap_utils\nprint('ran')", env=clean_env(SGLANG_DEBUG_REVERT_PR="25015")
    )
    assert r.returncode == 2 and "ran" not in r.stdout, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "set SGLFIX_PROFILE=sglang-0.5.23" in lines[0], r.stderr
    r = run_python("print('ran')", env=clean_env(SGLANG_DEBUG_REVERT_PR="25015", SGLFIX_PROFILE="reproduction"))
    assert r.returncode == 2 and "set SGLFIX_PROFILE=sglang-0.5.23" in r.stderr, r.stderr


def test_a_process_importing_the_reproduction_first_keeps_the_reproduction_profile():
    require_sglang()
    r = run_python(
        """
        import sglfix
        import sglfix.backends.srt.managers.overlap_utils as m
        print(sglfix.reverted_ids(), m.__name__)
    """,
        env=clean_env(SGLANG_DEBUG_REVERT_PR="26738:overlap-guard", SGLFIX_VERBOSE="1"),
    )
    assert r.returncode == 0, r.stderr
    assert "profile reproduction" in r.stderr and "sglfix.backends.srt.managers.overlap_utils" in r.stderr


def test_sglfix_env_says_which_profile_and_why():
    require_sglang()
    r = run_python(
        "from sglfix.cli import main; main(['env', '--json'])",
        env=clean_env(SGLANG_DEBUG_REVERT_PR="26738"),
        standins=False,
    )
    data = json.loads(r.stdout)
    assert data["profile"] == "sglang-0.5.23", data
    assert "sglang -> sglang-0.5.23" in data["profile_why"] and "sglfix.backends -> reproduction" in data["profile_why"]
    assert data["selected"][0]["id"].startswith("26738"), data
