"""The profile's reviewed equivalents (``sglfix.mutation.reviewed``): the file's entries, refused in
one line naming the entry and the fix; the marks that hold atop a campaign's candidate fixes; the
built-in profile's own file, each of whose marks names a function of its metadata surface."""

from __future__ import annotations

import fnmatch

import pytest

from sglfix.codebases import get_codebase
from sglfix.common.errors import ConfigError
from sglfix.mutation.reviewed import load_marks, marks_file, marks_for

GOOD = "- id: m-0123456789\n  function: pkg.mod.Cls.fn\n  why: sizes a buffer nothing reads\n"


def test_marks_are_read_by_id_and_hold_only_atop_the_fixes_they_name(tmp_path):
    path = tmp_path / "eq.yaml"
    path.write_text(GOOD + "- id: m-abcdefabcd\n  function: pkg.f\n  why: the fix widens the row\n  atop: [fix-a]\n")
    marks = load_marks(str(path))
    assert sorted(marks) == ["m-0123456789", "m-abcdefabcd"]
    assert sorted(marks_for(marks, applied=[])) == ["m-0123456789"]
    assert sorted(marks_for(marks, applied=["fix-a", "fix-b"])) == ["m-0123456789", "m-abcdefabcd"]
    (tmp_path / "empty.yaml").write_text("# nothing reviewed yet\n")
    assert load_marks(str(tmp_path / "empty.yaml")) == {}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (GOOD.replace("m-0123456789", "m-123"), "is not a mutant id"),
        (GOOD + "  reason: more\n", "entry 0.reason"),
        (GOOD.replace("  why: sizes a buffer nothing reads\n", ""), "entry 0.why"),
        (GOOD.replace("sizes a buffer nothing reads", "ok"), "entry 0.why"),
        (GOOD + GOOD, "m-0123456789 is marked twice"),
        ("id: m-0123456789\n", "entry the file"),
        ("- id: [unclosed\n", "not YAML"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(tmp_path, text, said):
    path = tmp_path / "eq.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_marks(str(path), shown="p/eq.yaml")
    message = str(err.value)
    assert said in message and message.startswith("p/eq.yaml") and "\n" not in message
    with pytest.raises(ConfigError, match="no such file"):
        load_marks(str(tmp_path / "missing.yaml"), shown="p/missing.yaml")


def test_the_profile_marks_name_functions_of_its_surface_and_each_is_argued():
    cb = get_codebase("sglang-0.5.23")
    path = marks_file(cb)
    assert path is not None
    marks = load_marks(path)
    assert len(marks) >= 20
    assert cb.mutate_surface
    for mark in marks.values():
        # On the surface mutate changes: a mark elsewhere would never be read.
        assert any(fnmatch.fnmatchcase(mark.function, glob) for glob in cb.mutate_surface), mark
    assert marks_file(get_codebase("reproduction")) is None
