"""A function's two digests (sglfix.execution.store.fingerprint): the plain one holds through any
edit that leaves its syntax alone; the positioned one moves with the function as a whole and
changes with any position inside it."""

from __future__ import annotations

import ast
import textwrap

from sglfix.execution.store.fingerprint import function_digests

SOURCE = textwrap.dedent("""
    import os

    class A:
        @staticmethod
        def f(x, y=2):
            z = x + y
            return os.path.join(str(z), "a")

    def g():
        return 1
""")


def _digests(text: str) -> dict[str, list]:
    return function_digests(ast.parse(text))


def test_a_function_moved_whole_keeps_both_digests_and_reports_where_it_is_now():
    before = _digests(SOURCE)
    after = _digests("# a comment\n\n\n" + SOURCE)
    for name in ("A.f", "g"):
        assert after[name][:2] == before[name][:2]
        assert after[name][2:] == [n + 3 for n in before[name][2:]]


def test_a_line_inserted_inside_changes_the_positioned_digest_only():
    before = _digests(SOURCE)
    after = _digests(SOURCE.replace("        z = x + y\n", "        z = x + y\n        # why\n"))
    assert after["A.f"][0] == before["A.f"][0] and after["A.f"][1] != before["A.f"][1]
    assert after["g"][:2] == before["g"][:2]  # moved whole


def test_a_column_moved_inside_changes_the_positioned_digest_only():
    before = _digests(SOURCE)
    after = _digests(SOURCE.replace("z = x + y", "z = x +  y"))
    assert after["A.f"][0] == before["A.f"][0] and after["A.f"][1] != before["A.f"][1]


def test_a_changed_statement_changes_both_and_no_other_function():
    before = _digests(SOURCE)
    after = _digests(SOURCE.replace("z = x + y", "z = x - y"))
    assert after["A.f"][0] != before["A.f"][0] and after["A.f"][1] != before["A.f"][1]
    assert after["g"] == before["g"]
    # Decorators and defaults are the function's own.
    for edit in (("@staticmethod", "@classmethod"), ("y=2", "y=3")):
        assert _digests(SOURCE.replace(*edit))["A.f"][0] != before["A.f"][0], edit


def test_the_same_shape_at_other_positions_is_another_positioned_digest():
    # Two bodies whose dumps without positions agree differ by where their nodes are.
    one = _digests("def f():\n    return (1 +\n            2)\n")["f"]
    two = _digests("def f():\n    return (1\n            + 2)\n")["f"]
    assert one[0] == two[0] and one[1] != two[1]


def test_a_fresh_store_takes_a_files_parse_from_the_machines_memo_and_parses_new_content(tmp_path, monkeypatch):
    """A file parsed by one store is not parsed again by another store on the same machine (the
    memo beside the other caches, by content); other bytes are parsed; a memo that cannot be
    opened only costs the parse."""
    import sglfix.execution.store as store

    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path / "cache"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text(SOURCE)
    parsed: list[str] = []
    real = store.file_digests
    monkeypatch.setattr(store, "file_digests", lambda data, *, path: parsed.append(path) or real(data, path=path))

    def parse_in_a_new_store(name: str) -> dict | None:
        opened = store.ResultStore(str(tmp_path / name), context="c", parts={}, top=str(code))
        try:
            return opened.files.parsed("m.py")
        finally:
            opened.close()

    first = parse_in_a_new_store("one")
    assert parse_in_a_new_store("two") == first and parsed == ["m.py"]
    (code / "m.py").write_text(SOURCE.replace("z = x + y", "z = x - y"))
    assert parse_in_a_new_store("three") != first and parsed == ["m.py", "m.py"]
    (tmp_path / "cache" / "parsed-digests.sqlite").unlink()
    (tmp_path / "cache" / "parsed-digests.sqlite").mkdir()  # cannot be opened as a database
    assert parse_in_a_new_store("four") is not None and len(parsed) == 3
