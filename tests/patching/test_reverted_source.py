"""Reverted code shows its own source: tracebacks, inspect.getsource and pdb quote what runs.

A reverted function's code carries a file name naming the revert, registered in linecache as
the real file with the function's lines replaced by the reverted text; a restore gives back
the original code, whose file is the real one.
"""

from __future__ import annotations

import importlib
import inspect
import io
import linecache
import os
import pdb
import subprocess
import sys
import textwrap
import traceback

import pytest

# sglfix.backends before anything imports triton (as tests/backends/conftest.py does): without
# CUDA its import selects the Triton interpreter, and refuses once triton is in.
import sglfix.backends  # noqa: F401
from sglfix import EditSpec, PatchSpec
from sglfix.patching.patcher import apply_specs, patch_function, real_filename
from sglfix.toggling.revert import revert

OVERLAP = "sglfix.backends.srt.managers.overlap_utils"
REVERT = "26738:overlap-guard"
FIXED = 'return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)'
REVERTED = "return any(b.needs_cpu_seq_lens for b in attn_backends)"
ON_TOP = "return all(b.needs_cpu_seq_lens for b in attn_backends)"


def _target():
    module = importlib.import_module(OVERLAP)
    return module.decide_needs_cpu_seq_lens


def _raised(fn) -> BaseException:
    with pytest.raises(AttributeError) as info:
        fn([None])
    return info.value


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _file_line(path: str, text: str) -> int:
    with open(path) as fh:
        return next(n for n, line in enumerate(fh, 1) if text in line)


def test_the_traceback_and_getsource_show_the_reverted_code_and_the_restore_the_fixed_one():
    fn = _target()
    original = fn.__code__
    with revert([REVERT]):
        code = fn.__code__
        shown = _formatted(_raised(fn))
        assert REVERTED in shown and FIXED not in shown, shown
        source = inspect.getsource(fn)
        assert REVERTED in source and FIXED not in source, source
        assert source.startswith("def decide_needs_cpu_seq_lens(")
        # The name says which revert runs; the real file and line stay recoverable from it.
        assert f"[sglfix revert {REVERT}]" in code.co_filename
        assert code.co_filename in shown
        assert real_filename(code.co_filename) == original.co_filename
        assert code.co_firstlineno == original.co_firstlineno
        line = _file_line(original.co_filename, FIXED)  # the reverted line replaces this one
        assert f'{code.co_filename}", line {line}, in ' in shown, shown
        assert linecache.getline(code.co_filename, line).strip() == REVERTED
    assert fn.__code__ is original and original.co_filename == real_filename(original.co_filename)
    source = inspect.getsource(fn)
    assert FIXED in source and REVERTED not in source, source
    assert fn([None]) is False


def test_pdb_lists_the_reverted_line():
    fn = _target()
    with revert([REVERT]):
        exc = _raised(fn)
    out = io.StringIO()
    debugger = pdb.Pdb(stdin=io.StringIO("up\nlist\nquit\n"), stdout=out, nosigint=True)
    debugger.use_rawinput = False
    debugger.reset()
    debugger.interaction(None, exc.__traceback__)
    listed = out.getvalue()
    assert REVERTED in listed and FIXED not in listed, listed
    assert f"[sglfix revert {REVERT}]" in listed, listed


def test_a_traceback_formatted_after_the_restore_and_a_cleared_linecache_stay_right():
    fn = _target()
    with revert([REVERT]):
        exc = _raised(fn)
    # Formatted only now (a worker that restores before it reports): still what ran.
    late = _formatted(exc)
    assert REVERTED in late and FIXED not in late, late
    linecache.clearcache()  # other code may drop every entry: the next revert registers again
    with revert([REVERT]):
        shown = _formatted(_raised(fn))
        assert REVERTED in shown and FIXED not in shown, shown
        assert REVERTED in inspect.getsource(fn)


def test_stacked_patches_each_show_their_own_source():
    fn = _target()
    with revert([REVERT]):
        below = fn.__code__
        top = patch_function(target=fn, edits=[EditSpec(match=REVERTED, replacement=ON_TOP)])
        try:
            assert f"[sglfix revert {REVERT} + patch]" in fn.__code__.co_filename
            assert top.original_code is below
            shown = _formatted(_raised(fn))
            assert ON_TOP in shown and REVERTED not in shown, shown
            assert ON_TOP in inspect.getsource(fn)
            shown = inspect.getsource(below)
            assert REVERTED in shown and ON_TOP not in shown, shown
        finally:
            top.restore()
        assert fn.__code__ is below
        shown = _formatted(_raised(fn))
        assert REVERTED in shown and ON_TOP not in shown, shown
    assert FIXED in inspect.getsource(fn)


def test_one_revert_on_two_functions_of_a_file_shows_each_its_own_text(tmp_path, monkeypatch):
    # The first function's reverted text is longer than its fix: the file's later lines move
    # in its shown copy, so the second function must be shown from a copy of its own.
    (tmp_path / "twofuncs.py").write_text(
        textwrap.dedent("""\
            def first(x):
                return x.fixed_first


            class Holder:
                def second(self, x):
                    return x.fixed_second
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("twofuncs")
    specs = [
        PatchSpec(
            target="twofuncs.first",
            edits=(EditSpec(match="return x.fixed_first", replacement="y = x\nz = y\nreturn z.pre_fix_first"),),
        ),
        PatchSpec(
            target="twofuncs.Holder.second",
            edits=(EditSpec(match="return x.fixed_second", replacement="return x.pre_fix_second"),),
        ),
    ]
    states = apply_specs(specs, allowed_prefixes=("twofuncs",), labels=["revert 1:x", "revert 1:x"])
    try:
        names = [mod.first.__code__.co_filename, mod.Holder.second.__code__.co_filename]
        assert len(set(names)) == 2 and all("[sglfix revert 1:x" in n for n in names), names
        assert all(real_filename(n) == str(tmp_path / "twofuncs.py") for n in names), names
        assert "pre_fix_first" in inspect.getsource(mod.first)
        second = inspect.getsource(mod.Holder.second)
        assert second.startswith("    def second(") and "pre_fix_second" in second, second
        for call, want, lineno in (
            (lambda: mod.first(None), "return z.pre_fix_first", 4),
            (lambda: mod.Holder().second(None), "return x.pre_fix_second", 7),
        ):
            with pytest.raises(AttributeError) as info:
                call()
            frame = traceback.extract_tb(info.value.__traceback__)[-1]
            assert (frame.line, frame.lineno) == (want, lineno), frame
    finally:
        for state in reversed(states):
            state.restore()
    assert "fixed_second" in inspect.getsource(mod.Holder.second)


def test_a_methods_carets_underline_the_reverted_expression(tmp_path, monkeypatch):
    (tmp_path / "caretmod.py").write_text("class K:\n    def run(self, word):\n        return word + 'fixed'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("caretmod")
    state = patch_function(
        target=mod.K.run,
        edits=[EditSpec(match="return word + 'fixed'", replacement="return word + 1")],
        allowed_prefixes=("caretmod",),
    )
    try:
        with pytest.raises(TypeError) as info:
            mod.K().run("a")
        lines = _formatted(info.value).splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip() == "return word + 1")
        quoted, carets = lines[at], lines[at + 1]
        marked = "".join(c for c, m in zip(quoted, carets) if m in "^~")
        assert marked == "word + 1", (quoted, carets)
    finally:
        state.restore()


def test_a_decorated_function_shows_from_its_first_decorator_as_the_original_does():
    from patch_fixtures import targets

    fn = inspect.unwrap(targets.decorated)
    original = fn.__code__
    state = patch_function(
        target=fn, edits=[EditSpec(match="y = x - 1", replacement="y = x - 10")], allowed_prefixes=("patch_fixtures",)
    )
    try:
        assert fn.__code__.co_firstlineno == original.co_firstlineno
        source = inspect.getsource(fn)
        assert source.startswith("@traced\ndef decorated(x):\n") and "y = x - 10" in source, source
    finally:
        state.restore()


def _env(**extra: str) -> dict[str, str]:
    drop = ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_PROFILE", "SGLFIX_TOGGLES_DIR", "SGLFIX_VERBOSE", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def test_the_startup_hook_process_quotes_the_reverted_line(tmp_path):
    code = textwrap.dedent(f"""
        import traceback
        import {OVERLAP} as m
        try:
            m.decide_needs_cpu_seq_lens([None])
        except AttributeError:
            print(traceback.format_exc())  # what an engine logs
        m.decide_needs_cpu_seq_lens([None])  # uncaught: the interpreter's own report
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(SGLANG_DEBUG_REVERT_PR=REVERT),
        timeout=120,
    )
    assert r.returncode == 1 and "AttributeError" in r.stderr, r.stderr
    for report in (r.stdout, r.stderr):
        assert REVERTED in report and FIXED not in report, report
        assert f"[sglfix revert {REVERT}]" in report, report
