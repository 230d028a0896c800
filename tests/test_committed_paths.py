"""Nothing committed under bench/results or profiles holds an absolute path of the machine that made
it (its checkout, a temporary folder, a home, an installed environment, a Windows drive): a path
there is relative to the repo, the code base or the package. bench/relpaths.py rewrites a result's
paths that way; the bench scripts pass what they write through it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT

SCANNED = ("bench/results", "profiles")
# The machine's own first folders, and a drive letter (C:\ or C:/); not a URL's path nor a relative one.
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home|tmp|opt|usr|var)/|(?<![\w\\])[A-Za-z]:[\\/](?=[\w.$~-])")
_WORD = re.compile(r"[^\s\"'`,;()\[\]{}<>|]+")


def _committed(root: Path) -> list[Path]:
    """The files git holds under SCANNED (every file there where ``root`` is no checkout)."""
    r = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--", *SCANNED], capture_output=True, text=True, check=False
    )
    if r.returncode == 0 and r.stdout:
        return [root / p for p in r.stdout.split("\0") if p]
    return sorted(f for d in SCANNED for f in (root / d).rglob("*") if f.is_file())


def _strings(value, where: str = ""):
    """(where, string) for every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where} (key)", k
            yield from _strings(v, f"{where}.{k}")


def _first_path(text: str) -> str | None:
    m = MACHINE_PATH.search(text)
    return None if m is None else _WORD.match(text, m.start()).group(0)


def first_offence(path: Path) -> str | None:
    """``<where>: <the path>`` for the first absolute machine path in the file, None when there is none."""
    data = path.read_bytes()
    if b"\0" in data:  # binary (a heatmap): no text to hold a path
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    if path.suffix == ".json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            pass  # not JSON after all: read it as text
        else:
            for where, s in _strings(value):
                if (found := _first_path(s)) is not None:
                    return f"{where or '(top)'}: {found}"
            return None
    for n, line in enumerate(text.splitlines(), 1):
        if (found := _first_path(line)) is not None:
            return f"line {n}: {found}"
    return None


def offences(root: Path) -> list[str]:
    out = []
    for f in _committed(root):
        if f.is_file() and (found := first_offence(f)) is not None:
            out.append(f"{f.relative_to(root)} {found}")
    return out


def test_no_committed_result_or_profile_holds_an_absolute_machine_path():
    files = _committed(ROOT)
    assert any(f.name == "matrix-sglang-cpu.json" for f in files), "bench/results is not where this test looks"
    found = offences(ROOT)
    assert not found, (
        f"{len(found)} file(s) hold an absolute path of a machine (bench/relpaths.py rewrites them):\n"
        + ("\n".join(found[:20]))
    )


@pytest.mark.parametrize(
    "text, found",
    [
        ('{"path": "/work/main/backends"}', "/work/main/backends"),
        ("see C:\\Users\\me\\out.json here", "C:\\Users\\me\\out.json"),
        ("D:/runs/x.json", "D:/runs/x.json"),
        ("(/tmp/site/flashinfer/decode.py:2144)", "/tmp/site/flashinfer/decode.py:2144"),
        ("https://github.com/sgl-project/sglang/tmp/x and bench/results/x.json", None),
        ("backends/srt/layers/attention/triton_backend.py:225, shard 1/3, cuda:0", None),
    ],
)
def test_the_scan_tells_a_machine_path_from_a_relative_one(text, found):
    assert _first_path(text) == found


def _relpaths():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import relpaths
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return relpaths


@pytest.mark.parametrize(
    "path, relative",
    [
        (f"{ROOT}/backends/srt/layers/attention/triton_backend.py", "backends/srt/layers/attention/triton_backend.py"),
        (f"{ROOT}/.venv/lib/python3.11/site-packages/sglang", "sglang"),
        ("/tmp/sgsite/sglang/srt/layers/attention/triton_backend.py", "sglang/srt/layers/attention/triton_backend.py"),
        ("/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/graphs.py", "torch/cuda/graphs.py"),
        ("/tmp/site/flashinfer/decode.py", "flashinfer/decode.py"),
        ("/root/.cache/sglfix/releases/sglang-0.5.15.post1/sglang", "sglang"),
        ("/root/out/matrix-cuda.json", "matrix-cuda.json"),
        ("/tmp/sglfix-scale-lgj2w3fb/run1.json", "<tmp>/run1.json"),
        ("/tmp/store-cpu.json", "<tmp>/store-cpu.json"),
        ("/home/someone/.cache/x", "~/.cache/x"),
        ("/opt/elsewhere/thing", None),
    ],
)
def test_relpaths_gives_each_kind_of_path_its_relative_form(path, relative):
    assert _relpaths().relative(path) == relative


def test_relpaths_rewrites_only_the_paths_of_a_json_file(tmp_path):
    """Indent, key order, the other strings and the last newline stay as the file had them."""
    value = {
        "command": "sglfix matrix --json /root/out/m.json",
        "n": 1.5e-05,
        "codebase": {"path": "/tmp/sgsite/sglang"},
    }
    f = tmp_path / "r.json"
    f.write_text(json.dumps(value, indent=3) + "\n")
    assert _relpaths().main([str(f)]) == 0
    want = {"command": "sglfix matrix --json m.json", "n": 1.5e-05, "codebase": {"path": "sglang"}}
    assert f.read_text() == json.dumps(want, indent=3) + "\n"
    assert first_offence(f) is None
