"""The environment variables' declarations (sglfix.common.environ), the cache folders derived from
one root (sglfix.common.cachedir) and the one atomic file writer (sglfix.common.atomic)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from sglfix.common import atomic, cachedir
from sglfix.common.environ import Envs, envs

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "sglfix" / "common" / "environ.py"
NAME = re.compile(r"\b(?:SGLFIX_[A-Z0-9_]+|SGLANG_DEBUG_REVERT_PR)\b")


def test_every_name_sglfix_spells_is_declared_once_with_a_doc():
    declared = [v.name for v in envs.declared()]
    assert len(declared) == len(set(declared))
    assert all(v.doc.strip() and "\n" not in v.doc for v in envs.declared())
    spelled = set(NAME.findall(HOME.read_text(encoding="utf-8")))
    assert spelled == set(declared)
    assert all(isinstance(getattr(envs, n), type(v)) for n, v in vars(Envs).items() if n.isupper())


def test_the_startup_line_checks_the_declared_names():
    """The ``.pth`` line cannot import sglfix before deciding whether to: it spells the names."""
    line = (ROOT / "zz-sglfix-startup.pth").read_text(encoding="utf-8")
    assert set(re.findall(r'os\.environ\.get\("([A-Z_]+)"', line)) == {
        envs.REVERT_PR.name,
        envs.SGLFIX_APPLY.name,
    }


def test_environ_is_a_leaf_importing_the_standard_library_alone():
    tree = ast.parse(HOME.read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "os", "collections.abc", "typing"}, imported


# -- typing, defaults, override


def test_unset_is_the_default_and_set_values_read_by_type(monkeypatch):
    for var in envs.declared():
        monkeypatch.delenv(var.name, raising=False)
        assert var.get() == var.default and not var.is_set()
    monkeypatch.setenv("SGLFIX_KERNEL_MEMO_MB", "64.5")
    assert envs.SGLFIX_KERNEL_MEMO_MB.get() == 64.5
    monkeypatch.setenv("SGLFIX_KERNEL_MEMO_MB", "lots")
    with pytest.raises(ValueError, match="SGLFIX_KERNEL_MEMO_MB='lots'"):
        envs.SGLFIX_KERNEL_MEMO_MB.get()
    monkeypatch.setenv("SGLFIX_PROFILE", "  sglang ")
    assert envs.SGLFIX_PROFILE.get() == "sglang"
    monkeypatch.setenv("SGLFIX_PROFILE", "  ")
    assert envs.SGLFIX_PROFILE.get() is None and envs.SGLFIX_PROFILE.is_set()
    monkeypatch.setenv("SGLFIX_TOGGLES_DIR", "")
    assert envs.SGLFIX_TOGGLES_DIR.get() is None
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", " 0 ")
    assert envs.REVERT_PR.get() == " 0 "  # as set: its reader decides what selects nothing


@pytest.mark.parametrize(
    ("name", "raw", "on"),
    [
        ("SGLFIX_VERBOSE", "1", True),
        ("SGLFIX_VERBOSE", "yes", True),
        ("SGLFIX_VERBOSE", " 0 ", False),
        ("SGLFIX_VERBOSE", "", False),
        ("SGLFIX_DEBUG", "1", True),
        ("SGLFIX_DEBUG", "true", False),
        ("SGLFIX_KERNEL_MEMO", "off", False),
        ("SGLFIX_KERNEL_MEMO", " no", False),
        ("SGLFIX_KERNEL_MEMO", "", True),
        ("SGLFIX_KERNEL_MEMO", "OFF", True),
    ],
)
def test_flags_read_as_their_readers_always_did(monkeypatch, name, raw, on):
    monkeypatch.setenv(name, raw)
    assert getattr(envs, name).get() is on


def test_set_unset_and_a_mapping_of_a_child_process(monkeypatch):
    monkeypatch.delenv("SGLFIX_KERNEL_MEMO", raising=False)
    child: dict[str, str] = {}
    envs.SGLFIX_KERNEL_MEMO.set(False, env=child)
    assert child == {"SGLFIX_KERNEL_MEMO": "0"} and "SGLFIX_KERNEL_MEMO" not in os.environ
    assert envs.SGLFIX_KERNEL_MEMO.get(env=child) is False
    assert envs.SGLFIX_KERNEL_MEMO.unset(env=child) == "0" and child == {}
    envs.SGLFIX_KERNEL_MEMO.set(False)
    assert os.environ["SGLFIX_KERNEL_MEMO"] == "0"
    envs.SGLFIX_KERNEL_MEMO.set(None)
    assert "SGLFIX_KERNEL_MEMO" not in os.environ


def test_override_restores_the_value_or_its_absence(monkeypatch):
    var = envs.REVERT_PR
    monkeypatch.delenv(var.name, raising=False)
    with var.override("26738"):
        assert var.get() == "26738"
    assert not var.is_set()
    monkeypatch.setenv(var.name, "0")
    with pytest.raises(RuntimeError), var.override(None):
        assert not var.is_set()
        raise RuntimeError
    assert var.raw() == "0"


def test_a_variable_is_no_truth_value():
    with pytest.raises(TypeError, match=r"SGLFIX_DEBUG: read the variable with \.get\(\)"):
        bool(envs.SGLFIX_DEBUG)


# -- one cache root


def test_every_cache_folder_derives_from_the_root(monkeypatch, tmp_path):
    for name in ("SGLFIX_CACHE", "SGLFIX_CACHE_DIR", "SGLFIX_STORE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = os.path.expanduser("~")
    assert cachedir.root() == os.path.join(home, ".cache", "sglfix")  # where the caches always were
    assert cachedir.arm() == cachedir.root()
    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path / "c"))
    root = str(tmp_path / "c")
    assert cachedir.root() == root
    assert [
        cachedir.results(),
        cachedir.releases(),
        cachedir.triton_key(),
        cachedir.file_digests(),
        cachedir.arm(),
    ] == [
        os.path.join(root, "results"),
        os.path.join(root, "releases"),
        os.path.join(root, "triton-key"),
        os.path.join(root, "file-digests.sqlite"),
        root,
    ]
    monkeypatch.setenv("SGLFIX_STORE", str(tmp_path / "s"))
    monkeypatch.setenv("SGLFIX_CACHE_DIR", str(tmp_path / "a"))
    assert (cachedir.results(), cachedir.arm()) == (str(tmp_path / "s"), str(tmp_path / "a"))


def test_the_arm_cache_stays_under_xdg_cache_home_without_sglfix_cache(monkeypatch, tmp_path):
    for name in ("SGLFIX_CACHE", "SGLFIX_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cachedir.arm() == str(tmp_path / "sglfix")
    assert cachedir.root() == os.path.join(os.path.expanduser("~"), ".cache", "sglfix")


def test_the_store_and_the_releases_use_the_root(monkeypatch, tmp_path):
    from sglfix.codebases import releases
    from sglfix.execution.store import default_dir

    monkeypatch.delenv("SGLFIX_STORE", raising=False)
    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path))
    assert default_dir() == str(tmp_path / "results")
    assert releases._folder("sglang", "0.5.9") == tmp_path / "releases" / "sglang-0.5.9"


# -- one atomic writer


class _Boom(Exception):
    pass


@pytest.mark.parametrize("failure", [_Boom, KeyboardInterrupt])
def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temporary_one(monkeypatch, tmp_path, failure):
    path = tmp_path / "report.json"
    path.write_text("old\n")
    real = os.fsync

    def half_then_fail(fd):
        real(fd)
        raise failure

    monkeypatch.setattr(atomic.os, "fsync", half_then_fail)
    with pytest.raises(failure):
        atomic.write_atomic(path, "new " * 10000)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_write_atomic_writes_text_and_bytes_whole_with_a_plain_files_mode(tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    atomic.write_atomic(str(tmp_path / "a.txt"), "é\n")
    atomic.write_atomic(tmp_path / "b.bin", b"\x00\xff", fsync=False)
    assert (tmp_path / "a.txt").read_bytes() == "é\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]
