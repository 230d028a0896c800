"""Patch engine: every target kind, exact restore, atomicity, LIFO stacking, refusals, fence."""

from __future__ import annotations

import asyncio
import sys

import pytest
from patch_fixtures import targets as T

from sglfix import CodePatcher, EditSpec, PatchApplicationError, PatchSpec, apply_patches_from_config
from sglfix.common.errors import ConfigError, PatchStateError, TargetError
from sglfix.patching import patcher
from sglfix.patching import state as patch_state
from sglfix.patching.patcher import apply_specs, patch_function
from sglfix.patching.source import source_block

A = ("patch_fixtures",)
M = "patch_fixtures.targets"


def spec(target, match, replacement=None, **kw):
    if replacement is not None:
        kw["replacement"] = replacement
    return PatchSpec(target=f"{M}.{target}", edits=(EditSpec(match=match, **kw),))


CASES = [
    # target, match, replacement, probe, value before, value after
    ("plain", "total = total * SCALE", "total = total * 100", lambda: T.plain(1), 9, 300),
    (
        "Child.greet",
        'return word + "-child"',
        'return word + "-patched"',
        lambda: T.Child().greet(),
        "base-child",
        "base-patched",
    ),
    ("Child.double", "return x * 2", "return x * 20", lambda: T.Child.double(2), 4, 40),
    (
        "Child.tagged",
        "return (cls.__name__, x)",
        "return (cls.__name__, -x)",
        lambda: T.Child.tagged(3),
        ("Child", 3),
        ("Child", -3),
    ),
    ("Child.size", "return value", "return value * 10", lambda: T.Child().size, 4, 40),
    ("Child.Inner.depth", "result = level + 1", "result = level + 50", lambda: T.Child.Inner().depth(), 2, 51),
    ("counter", "return x + step", "return x + step * 2", lambda: T.counter(1), 6, 11),
    ("decorated", "y = x - 1", "y = x - 10", lambda: T.decorated(1), 0, -9),
    ("fetch", "value = x * 3", "value = x * 30", lambda: asyncio.run(T.fetch(1)), 3, 30),
    ("gen", "yield i", "yield -i", lambda: list(T.gen(3)), [0, 1, 2], [0, -1, -2]),
]


@pytest.mark.parametrize("target,match,replacement,probe,before,after", CASES, ids=[c[0] for c in CASES])
def test_every_kind_patches_and_restores_exactly(target, match, replacement, probe, before, after):
    from sglfix.patching.targets import resolve_target

    fn = resolve_target(f"{M}.{target}", allowed_prefixes=A).function
    original = fn.__code__
    assert probe() == before
    (state,) = apply_specs([spec(target, match, replacement)], allowed_prefixes=A)
    assert probe() == after
    assert fn.__code__ is not original
    state.restore()
    assert fn.__code__ is original
    assert probe() == before


def test_defaults_and_decorator_state_survive():
    calls = T.decorated.calls
    with CodePatcher(patches=[spec("decorated", "y = x - 1", "y = x - 2")], allowed_prefixes=A):
        assert T.decorated(5) == 3
        assert T.decorated.calls == calls + 1  # the wrapper still runs once: not re-decorated
    with CodePatcher(patches=[spec("plain", "total = x + y", "total = x + y + 1")], allowed_prefixes=A):
        assert T.plain(1) == (1 + 2 + 1) * 3  # default y=2 kept


def test_closure_keeps_its_cells_even_when_the_edit_drops_a_reference():
    with CodePatcher(patches=[spec("counter", "seen.append(x)", "pass")], allowed_prefixes=A):
        assert T.counter(1) == 6
    assert T.counter(2) == 7


def test_prepend_append_and_multiline_reindent():
    with CodePatcher(patches=[spec("plain", "return total", prepend="total = -total")], allowed_prefixes=A):
        assert T.plain(1) == -9
    with CodePatcher(
        patches=[spec("plain", "total = x + y", append="if total > 2:\n    total = 100")], allowed_prefixes=A
    ):
        assert T.plain(1) == 300
        assert T.plain(0, 1) == 3


def test_preamble_goes_after_the_signature():
    s = PatchSpec(
        target=f"{M}.plain",
        edits=(EditSpec(match="return total", replacement="return total + EXTRA"),),
        preamble="EXTRA = 1000",
    )
    with CodePatcher(patches=[s], allowed_prefixes=A):
        assert T.plain(1) == 1009


def test_not_found_names_target_file_line_and_closest_window_diff():
    with pytest.raises(PatchApplicationError) as info:
        apply_specs([spec("plain", "total = total * SCALAR", "x")], allowed_prefixes=A)
    text = str(info.value)
    first = text.splitlines()[0]
    assert f"{M}.plain" in first and "not found" in first
    assert "targets.py:" in first
    assert "closest at" in text and "+total = total * SCALE" in text and "-total = total * SCALAR" in text


def test_found_several_times_lists_every_position():
    with pytest.raises(PatchApplicationError) as info:
        apply_specs([spec("repeated", "x = x + 1", "x = x + 2")], allowed_prefixes=A)
    first = str(info.value).splitlines()[0]
    assert "found 2 times" in first
    assert first.count("targets.py:") == 2


@pytest.mark.parametrize("fail_at", range(4))
def test_atomic_failure_at_each_position_leaves_everything_as_it_was(monkeypatch, fail_at):
    names = ["plain", "Child.double", "counter", "fetch"]
    specs = [
        spec("plain", "total = total * SCALE", "total = 0"),
        spec("Child.double", "return x * 2", "return 0"),
        spec("counter", "return x + step", "return 0"),
        spec("fetch", "value = x * 3", "value = 0"),
    ]
    from sglfix.patching.targets import resolve_target

    fns = [resolve_target(f"{M}.{n}", allowed_prefixes=A).function for n in names]
    codes = [f.__code__ for f in fns]
    real_install = patcher._install
    count = {"n": 0}

    def flaky(item):
        if count["n"] == fail_at:
            raise RuntimeError("injected")
        count["n"] += 1
        return real_install(item)

    monkeypatch.setattr(patcher, "_install", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        apply_specs(specs, allowed_prefixes=A)
    assert [f.__code__ for f in fns] == codes
    assert all(f.__code__ is c for f, c in zip(fns, codes))
    assert not patch_state._STACKS


def test_a_bad_later_patch_applies_nothing():
    before = T.plain.__code__
    with pytest.raises(PatchApplicationError):
        apply_specs(
            [spec("plain", "total = total * SCALE", "total = 0"), spec("Child.double", "nope", "x")], allowed_prefixes=A
        )
    assert T.plain.__code__ is before and T.plain(1) == 9


def test_lifo_stacking_edits_the_patched_source_and_restores_in_reverse():
    original = T.plain.__code__
    (first,) = apply_specs([spec("plain", "total = total * SCALE", "total = total * 10")], allowed_prefixes=A)
    (second,) = apply_specs([spec("plain", "total = total * 10", "total = total * 20")], allowed_prefixes=A)
    assert T.plain(1) == 60
    with pytest.raises(PatchStateError, match="last in, first out"):
        first.restore()
    assert T.plain(1) == 60
    second.restore()
    assert T.plain(1) == 30
    first.restore()
    assert T.plain.__code__ is original


def test_refusals_name_what_the_target_is():
    cases = {
        "square": "lambda",
        "c_function": "builtin/C function",
        "builtin_len": "builtin/C function",
        "partial_plain": "functools.partial",
        "not_callable": "not a function",
        "Child": "a class",
    }
    for name, words in cases.items():
        with pytest.raises(TargetError, match=words.replace("(", r"\(").replace(")", r"\)")):
            apply_specs([spec(name, "x", "y")], allowed_prefixes=A)


def test_triton_kernel_is_refused():
    import types

    import triton
    import triton.language as tl

    mod = types.ModuleType("patch_fixtures.kern")

    @triton.jit
    def kernel(x_ptr):
        tl.store(x_ptr, 1)

    mod.kernel = kernel
    sys.modules[mod.__name__] = mod
    try:
        with pytest.raises(TargetError, match=r"triton\.jit kernel"):
            apply_specs(
                [PatchSpec(target="patch_fixtures.kern.kernel", edits=(EditSpec(match="x", replacement="y"),))],
                allowed_prefixes=A,
            )
    finally:
        del sys.modules[mod.__name__]


@pytest.mark.parametrize(
    "target",
    ["os.path.join", "subprocess.run", "builtins.print", "sglfix.patcher.apply_specs", "sglfix.cli.main", "json.dumps"],
)
def test_fence_refuses_before_importing(target):
    with pytest.raises(TargetError, match=r"protected|outside the allowed"):
        apply_specs([PatchSpec(target=target, edits=(EditSpec(match="x", replacement="y"),))])
    with pytest.raises(TargetError, match="protected"):
        apply_specs(
            [PatchSpec(target="os.getcwd", edits=(EditSpec(match="x", replacement="y"),))], allowed_prefixes=("os",)
        )


def test_outside_prefix_module_is_not_imported():
    assert "patch_fixtures.never_imported" not in sys.modules
    with pytest.raises(TargetError, match="outside the allowed"):
        apply_specs(
            [PatchSpec(target="patch_fixtures.never_imported.f", edits=(EditSpec(match="x", replacement="y"),))]
        )
    assert "patch_fixtures.never_imported" not in sys.modules


def test_unknown_attribute_suggests_the_nearest():
    with pytest.raises(TargetError, match="did you mean 'plain'"):
        apply_specs([spec("plian", "x", "y")], allowed_prefixes=A)


def test_sglang_call_shapes():
    yaml_text = f"""
patches:
  - target: {M}.plain
    edits:
      - match: |
          total = total * SCALE
        replacement: |
          total = total * 7
"""
    states = apply_patches_from_config(yaml_text, allowed_prefixes=A)
    assert T.plain(1) == 21
    assert "total = total * 7" in states[0].source_after
    for s in reversed(states):
        s.restore()
    assert T.plain(1) == 9
    state = patch_function(
        target=T.plain, edits=[EditSpec(match="return total", replacement="return -total")], allowed_prefixes=A
    )
    assert T.plain(1) == -9
    state.restore()
    with CodePatcher(
        patches=[{"target": f"{M}.plain", "edits": [{"match": "return total", "replacement": "return 0"}]}],
        allowed_prefixes=A,
    ):
        assert T.plain(1) == 0
    assert T.plain(1) == 9


def test_edit_that_breaks_the_syntax_is_refused_with_a_file_line():
    with pytest.raises(PatchApplicationError, match=r"does not parse .*line \d+"):
        apply_specs([spec("plain", "return total", "return (total")], allowed_prefixes=A)


@pytest.mark.parametrize(
    "match, replacement",
    [
        ("def plain(x: int, y: int = 2) -> int:", "def plain(x: int, y: int = 2, z: int = 0) -> int:"),  # added
        ("def plain(x: int, y: int = 2) -> int:", "def plain(x: int, y: int) -> int:"),  # a default taken away
        ("def plain(x: int, y: int = 2) -> int:", "def plain(x: int, *, y: int = 2) -> int:"),  # keyword-only now
        ("def plain(x: int, y: int = 2) -> int:", "def plain(w: int, y: int = 2) -> int:"),  # renamed
        ("def plain(x: int, y: int = 2) -> int:", "def plain(x: int, y: int = 2, *rest) -> int:"),  # *args
    ],
    ids=["added", "default-dropped", "keyword-only", "renamed", "varargs"],
)
def test_an_edit_of_the_parameters_is_refused_and_nothing_is_applied(match, replacement):
    # The swapped code keeps the defaults the module's def made, matched by position: a new
    # parameter with a default would shift them onto the wrong names.
    before = T.plain.__code__
    with pytest.raises(PatchApplicationError, match="changes the function's parameters"):
        apply_specs([spec("plain", match, replacement)], allowed_prefixes=A)
    assert T.plain.__code__ is before and T.plain(1) == 9


def test_spec_validation_in_python():
    with pytest.raises(ConfigError, match="only one of"):
        EditSpec(match="a", replacement="b", append="c")
    with pytest.raises(ConfigError, match="empty"):
        EditSpec(match="   ")
    with pytest.raises(ConfigError, match="dotted path"):
        PatchSpec(target="nodots", edits=(EditSpec(match="a"),))


def test_restore_all_is_all_or_nothing_under_a_stacked_patch():
    """Restoring a set while another patch sits on one of its functions changes nothing."""
    from sglfix.patching.patcher import restore_all

    plain, double = T.plain.__code__, T.Child.double.__code__
    first = apply_specs(
        [
            spec("plain", "total = total * SCALE", "total = total * 10"),
            spec("Child.double", "return x * 2", "return x * 5"),
        ],
        allowed_prefixes=A,
    )
    (on_top,) = apply_specs([spec("plain", "total = total * 10", "total = total * 20")], allowed_prefixes=A)
    with pytest.raises(PatchStateError, match="last in, first out"):
        restore_all(first)
    # Before: Child.double (restored first, being last) came back while plain stayed patched.
    assert T.Child.double(1) == 5 and T.plain(1) == 60
    assert all(not s.restored for s in first)
    with (
        pytest.raises(PatchStateError),
        CodePatcher(patches=[spec("Child.double", "return x * 5", "return x * 7")], allowed_prefixes=A),
    ):
        assert T.Child.double(1) == 7
        restore_all(first)  # refused: the CodePatcher's patch is on top of Child.double
    assert T.Child.double(1) == 5
    on_top.restore()
    restore_all(first)
    assert T.plain.__code__ is plain and T.Child.double.__code__ is double


def test_patch_specs_are_pydantic_models_with_unknown_keys_forbidden():
    from pydantic import BaseModel

    from sglfix.patching.types import PatchConfig

    for model in (EditSpec, PatchSpec, PatchConfig):
        assert issubclass(model, BaseModel) and model.model_config["extra"] == "forbid"
    with pytest.raises(ConfigError, match=r"unknown key 'replace' in EditSpec \(did you mean 'replacement'\?\)"):
        EditSpec(match="a", replace="b")
    with pytest.raises(ConfigError, match=r"PatchSpec.edits\[0\].match is empty"):
        PatchSpec(target=f"{M}.plain", edits=[{"match": " "}])
    with pytest.raises(ConfigError, match="non-empty list"):
        PatchSpec(target=f"{M}.plain", edits=[])
    # sglang's rule: at most one mode carries text; a blank one does not count.
    assert EditSpec(match="a", replacement="", append="b").mode == "append"
    assert EditSpec(match="a", replacement=None).replacement == ""


def test_default_prefixes_come_from_the_code_under_test():
    from sglfix.common.codebase import CODE_UNDER_TEST
    from sglfix.patching.targets import DEFAULT_ALLOWED_PREFIXES

    assert CODE_UNDER_TEST == "sglfix.backends"
    assert DEFAULT_ALLOWED_PREFIXES == (CODE_UNDER_TEST, "sglang")


def test_is_code_under_test_by_module_name_and_by_file():
    import importlib.util
    import os

    from sglfix.common.codebase import is_code_under_test

    assert is_code_under_test("sglfix.backends")
    assert is_code_under_test("sglfix.backends.srt.layers.attention.triton_backend")
    for name in ("sglfix", "sglfix.backendsx", "sglfix.harness.cell", "sglang.srt.x", "backends", "", "<string>"):
        assert not is_code_under_test(name), name
    spec = importlib.util.find_spec("sglfix.backends")
    root = spec.submodule_search_locations[0]
    assert is_code_under_test(os.path.join(root, "srt", "layers", "attention", "triton_backend.py"))
    assert not is_code_under_test(os.path.join(os.path.dirname(root), "sglfix", "harness", "cell.py"))
    # A directory merely named "backends" elsewhere is not the code under test.
    assert not is_code_under_test("/tmp/elsewhere/backends/srt/x.py")
    # Finding the package's directory does not import it (importing the backends costs torch).
    import subprocess

    probe = (
        "import sys; from sglfix.common.codebase import is_code_under_test; "
        "is_code_under_test('/x/backends/y.py'); print('sglfix.backends' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_applying_again_reuses_the_work_and_gives_the_same_code(tmp_path, monkeypatch):
    """The second apply of a revert reads no source and compiles nothing, and installs a code
    object equal to the first; twin functions in two files never share a cached result."""
    import importlib

    body = "def twin(x):\n    y = x + 1\n    return y\n"
    for name in ("twin_a", "twin_b"):
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = importlib.import_module("twin_a"), importlib.import_module("twin_b")
    assert a.twin.__code__ == b.twin.__code__  # equal by value: only the file differs
    edit = [EditSpec(match="y = x + 1", replacement="y = x + 2")]
    ALLOW = ("twin_a", "twin_b")
    first = patch_function(target=a.twin, edits=edit, allowed_prefixes=ALLOW)
    code_a = a.twin.__code__
    first.restore()
    calls = {"source": 0, "compile": 0}
    real_source, real_compile = patcher.source_block, patcher.compile_edited
    monkeypatch.setattr(
        patcher, "source_block", lambda fn: calls.__setitem__("source", calls["source"] + 1) or real_source(fn)
    )
    monkeypatch.setattr(
        patcher,
        "compile_edited",
        lambda **kw: calls.__setitem__("compile", calls["compile"] + 1) or real_compile(**kw),
    )
    again = patch_function(target=a.twin, edits=edit, allowed_prefixes=ALLOW)
    assert calls == {"source": 0, "compile": 0} and a.twin.__code__ == code_a and a.twin(1) == 3
    again.restore()
    other = patch_function(target=b.twin, edits=edit, allowed_prefixes=ALLOW)
    assert calls == {"source": 1, "compile": 1}  # another file: its own source and code
    assert b.twin.__code__.co_filename.endswith("twin_b.py") and b.twin(1) == 3
    other.restore()
    assert a.twin(1) == b.twin(1) == 2


def test_the_source_block_is_what_inspect_reads(tmp_path, monkeypatch):
    """The engine reads a function's source without the tokenizer; on tricky layouts it must
    give inspect.getsourcelines' block exactly, or fall back to inspect."""
    import importlib
    import inspect

    (tmp_path / "layouts.py").write_text(
        "import functools\n\n\n"
        "def deco(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a)\n    return inner\n\n\n"
        "@deco\ndef decorated(x):\n    return x  # same line\n    # trailing, body level\n\n        # deeper\n# col 0\n"
        "    # body level again\n\n\nclass K:\n    def method(\n        self,\n        y,\n    ):\n"
        "        s = '''\nnot code\n'''\n        if y:\n            pass\n        else:\n            pass\n\n"
        "    def one(self): return 1\n    # after a one-line def\n\n\n"
        "def last(z):\n    return (z +\n1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("layouts")
    for fn in (mod.decorated, mod.K.method, mod.K.one, mod.last, mod.deco):
        want = inspect.getsourcelines(fn)
        got = source_block(fn)
        assert got is None or got == ("".join(want[0]), want[1]), fn
        assert patcher.current_source(fn) == ("".join(want[0]), want[1])


def test_a_target_whose_module_is_not_imported_yet_still_resolves_to_that_module():
    """``sglfix`` is imported, ``sglfix.backends...`` not yet: the module is imported, never the
    attribute chain read off the parent package."""
    import subprocess

    code = (
        "import sys, sglfix\nfrom sglfix.patching.targets import split_module\n"
        "assert 'sglfix.backends.srt.managers.overlap_utils' not in sys.modules\n"
        "m, rest = split_module('sglfix.backends.srt.managers.overlap_utils.decide_needs_cpu_seq_lens')\n"
        "print(m.__name__, rest)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sglfix.backends.srt.managers.overlap_utils", "['decide_needs_cpu_seq_lens']"]
