"""Every refusal of bad input, timed as a user meets it: one ``sglfix`` (or ``python``/``pytest``)
command per row, each in a fresh temporary folder, checked for what the README promises: the
exit code (2 for bad input), one line on stderr naming the thing, no traceback, within 3 s,
no worker started (a sampler watches for ``sglfix.execution.serve`` processes while the command
runs), nothing written where an output was asked for, and no process left behind.

Rows follow the causes of the input-hygiene issue (1-12), the last bad inputs (34.8-34.14), the
options added since (54.11-54.14: --apply, --expect-fixes, report finding, --release, --cache,
bisect --releases, toggle port, variants' version ranges, model.sliding_window) and the CLI
conventions; a few rows are not refusals and say what they expect instead (cause 4: the revert
applies; cause 5: a bad COLUMNS is ignored; cause 11: doctor reports the broken toggle and checks
the rest; causes 34.13 and 54.11: a SIGTERM while a report is written leaves nothing, exit 143;
cause 54.13: a diff path with . and .. segments maps as the plain one).

    python bench/refusals.py [--json bench/results/refusals.json] [--limit-s 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from relpaths import relativize

ROOT = Path(__file__).resolve().parent.parent
FAST = "triton-decode@cg=eager,gpu_only=off"
CPU_REPORT = ROOT / "bench" / "results" / "matrix-cpu.json"
BISECT_REPORT = ROOT / "bench" / "results" / "bisect-cpu.json"
SGLANG_REPORT = ROOT / "bench" / "results" / "matrix-sglang-cpu.json"
TARGET = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode"


@dataclass
class Row:
    cause: str
    what: str
    argv: list[str]  # "sglfix ..." runs the console script; "python"/"pytest" the interpreter's
    needle: str  # a text the one stderr line (or the output, for rows that are not refusals) holds
    code: int = 2
    env: dict = field(default_factory=dict)
    must_not_exist: list[str] = field(default_factory=list)
    stdout_has: str | None = None
    empty_dir: str | None = None  # a folder that must hold nothing afterwards (no temporary file left)


def _toggle(folder: Path, pr: int, patch: dict) -> str:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{pr}.yaml").write_text(yaml.safe_dump({"pr": pr, "title": "bench", "patches": [patch]}))
    return str(folder)


def _nested_merges(levels: int) -> str:
    lines = ["a0: &a0 {x: 1, y: 2}"]
    lines += [f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}], k{i}: {i}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _nested_aliases(levels: int) -> str:
    lines = ["l0: &l0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _silent_listener() -> int:
    """A TCP port that accepts connections and never says a word (not Ray): the port."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list = []

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            held.append(conn)  # kept open and silent until the bench exits

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


def _sigterm_during_write(report: Path, out: Path) -> str:
    """A ``python -c`` program: ``report merge`` that gets SIGTERM just after its report's
    temporary file is created."""
    return (
        "import os, signal, tempfile\n"
        "real = tempfile.mkstemp\n"
        "def mkstemp(*a, **k):\n"
        "    made = real(*a, **k)\n"
        "    if k.get('suffix') == '.tmp':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return made\n"
        "tempfile.mkstemp = mkstemp\n"
        "from sglfix.cli import main\n"
        f"main(['report', 'merge', {str(report)!r}, '-o', {str(out)!r}])\n"
    )


def _diffs_34(tmp: Path) -> dict[str, list[str]]:
    """``toggle from-diff`` / ``from-git`` commands over bad diffs of the reproduction's Triton
    backend: one that edits a comment only, an empty file, a path that climbs above the root, and
    a git commit whose diff holds a Latin-1 byte."""
    import difflib

    rel = "backends/srt/layers/attention/triton_backend.py"
    post = (ROOT / rel).read_text()
    clamp = "                kv_lens = torch.clamp(kv_lens, min=0)\n"

    def diff(pre: str, a: str = f"a/{rel}", b: str = f"b/{rel}") -> str:
        return "".join(difflib.unified_diff(pre.splitlines(True), post.splitlines(True), a, b))

    def from_diff(name: str, text: str) -> list[str]:
        (tmp / name).write_text(text)
        return ["sglfix", "toggle", "from-diff", str(tmp / name), "--pr", "90001"]

    comment = post.replace("# PR 26651: padded rows", "# PR 26651: the padded rows", 1)
    assert comment != post
    repo = tmp / "repo"
    path = repo / rel
    path.parent.mkdir(parents=True)
    path.write_bytes(post.encode().replace(clamp.encode(), b"                kv_lens = kv_lens  # caf\xe9\n", 1))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "before"]):
        subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", *args],
            check=True,
            capture_output=True,
            env=env,
        )
    path.write_text(post)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-am", "fix"],
        check=True,
        capture_output=True,
        env=env,
    )
    return {
        "comment": from_diff("comment.patch", diff(comment)),
        "empty": from_diff("empty.patch", ""),
        "climb": from_diff("climb.patch", diff(post.replace(clamp, "", 1), f"a/../{rel}", f"b/../{rel}")),
        "latin1": ["sglfix", "toggle", "from-git", "HEAD", "--repo", str(repo), "--pr", "90001"],
    }


def _damaged(tmp: Path, report: dict, name: str, **change) -> Path:
    path = tmp / f"damaged-{name}.json"
    path.write_text(json.dumps({**report, **change}))
    return path


def rows(tmp: Path) -> list[Row]:
    fifo = tmp / "pipe.yaml"
    os.mkfifo(fifo)
    fifo_toggles = tmp / "fifo-toggles"
    fifo_toggles.mkdir()
    os.mkfifo(fifo_toggles / "11111.yaml")
    merges, aliases = tmp / "merges.yaml", tmp / "aliases.yaml"
    merges.write_text(_nested_merges(12))
    aliases.write_text(_nested_aliases(9))
    merge_toggles = tmp / "merge-toggles"
    merge_toggles.mkdir()
    (merge_toggles / "11111.yaml").write_text(_nested_merges(12))
    report = json.loads(CPU_REPORT.read_text())
    report["cells"] = report["cells"][:20]
    damaged = tmp / "damaged.json"
    damaged.write_text(json.dumps(dict(report, wall_s="long")))
    scenarios = sorted({c["scenario"] for c in report["cells"]})
    only_a, only_b = tmp / "a.json", tmp / "b.json"
    only_a.write_text(json.dumps(dict(report, cells=[c for c in report["cells"] if c["scenario"] == scenarios[0]])))
    only_b.write_text(json.dumps(dict(report, cells=[c for c in report["cells"] if c["scenario"] != scenarios[0]])))
    no_match = _toggle(
        tmp / "t-nomatch",
        90001,
        {"target": TARGET, "edits": [{"match": "not in the source\n", "replacement": "pass\n"}]},
    )
    no_parse = _toggle(
        tmp / "t-noparse",
        90001,
        {
            "target": TARGET,
            "edits": [{"match": "        md = self.forward_metadata\n", "replacement": "        md = = 1\n"}],
        },
    )
    outside = _toggle(
        tmp / "t-outside",
        90002,
        {"target": "colorsys.rgb_to_yiq", "edits": [{"match": "y = 0.30*r + 0.59*g + 0.11*b\n", "append": "pass\n"}]},
    )
    script = tmp / "sglfix"
    script.write_text(
        "import sglfix.backends.srt.managers.overlap_utils as m\n"
        "try:\n    m.decide_needs_cpu_seq_lens([None]); print('fixed')\nexcept AttributeError:\n    print('pre-fix')\n"
    )
    broken_src = tmp / "src"
    shutil.copytree(ROOT / "backends", broken_src / "sglfix" / "backends")
    (broken_src / "sglfix" / "__init__.py").write_text("")
    (broken_src / "sglfix" / "backends" / "srt" / "managers" / "overlap_utils.py").write_text("def f(:\n")
    (tmp / "test_x.py").write_text("def test_x():\n    pass\n")
    run = ["sglfix", "run", "-s", FAST, "--device", "cpu"]
    out = [
        Row(
            "1",
            "scenario file is a FIFO",
            ["sglfix", "run", "--scenario-file", str(fifo), "--device", "cpu"],
            "is a FIFO",
        ),
        Row(
            "1",
            "scenario file is /dev/zero",
            ["sglfix", "run", "--scenario-file", "/dev/zero", "--device", "cpu"],
            "is a device",
        ),
        Row("1", "report compare of a FIFO", ["sglfix", "report", "compare", str(CPU_REPORT), str(fifo)], "is a FIFO"),
        Row(
            "1",
            "--shard-costs is a FIFO",
            ["sglfix", "matrix", "--shard", "1/2", "--shard-costs", str(fifo), "-s", FAST, "--device", "cpu"],
            "is a FIFO",
        ),
        Row("1", "a FIFO in the toggles dir", ["sglfix", "--toggles", str(fifo_toggles), "list"], "is a FIFO"),
        Row(
            "1",
            "start-up hook, FIFO in the toggles dir",
            ["python", "-c", "print('ran')"],
            "is a FIFO",
            env={"SGLANG_DEBUG_REVERT_PR": "11111", "SGLFIX_TOGGLES_DIR": str(fifo_toggles)},
        ),
        Row(
            "2",
            "--json under /proc",
            [*run, "--json", "/proc/x.json"],
            "cannot create a file",
            must_not_exist=["/proc/x.json"],
        ),
        Row("2", "--json ''", [*run, "--json", ""], "the path is empty"),
        Row(
            "3",
            "revert whose match is not in the code",
            ["sglfix", "--toggles", no_match, "run", "-r", "90001", "-s", FAST, "--device", "cpu"],
            "match text not found",
        ),
        Row(
            "3",
            "revert whose replacement does not parse",
            ["sglfix", "--toggles", no_parse, "matrix", "-s", FAST, "--device", "cpu"],
            "does not parse",
        ),
        Row(
            "3",
            "revert of a target outside the allow-list",
            ["sglfix", "--toggles", outside, "run", "-r", "90002", "-s", FAST, "--device", "cpu"],
            "allowed",
        ),
        Row(
            "3",
            "show --diff of a revert that does not apply",
            ["sglfix", "--toggles", no_match, "show", "90001", "--diff"],
            "sglfix doctor",
        ),
        Row(
            "4",
            "a user's script named sglfix gets the revert",
            ["python", str(script)],
            "pre-fix",
            code=0,
            env={"SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard"},
            stdout_has="pre-fix",
        ),
        Row("5", "COLUMNS=abc, piped", ["sglfix", "list"], "", code=0, env={"COLUMNS": "abc"}),
        Row(
            "6",
            "scenario file with nested merge keys",
            ["sglfix", "run", "--scenario-file", str(merges), "--device", "cpu"],
            "merge keys (<<) are not supported",
        ),
        Row(
            "6",
            "scenario file with nested aliases",
            ["sglfix", "run", "--scenario-file", str(aliases), "--device", "cpu"],
            "more than 32 YAML aliases",
        ),
        Row(
            "6",
            "toggle file with nested merge keys",
            ["sglfix", "--toggles", str(merge_toggles), "list"],
            "merge keys (<<) are not supported",
        ),
        Row(
            "7",
            "merge --gate of a damaged report",
            ["sglfix", "report", "merge", str(damaged), "-o", str(tmp / "merged.json"), "--gate"],
            str(damaged),
            must_not_exist=[str(tmp / "merged.json")],
        ),
        Row(
            "7",
            "compare with a damaged report",
            ["sglfix", "report", "compare", str(CPU_REPORT), str(damaged)],
            str(damaged),
        ),
        Row(
            "8",
            "ray: an id that is not registered",
            ["sglfix", "run", "--executor", "ray", "--device", "cpu", "-s", FAST, "-r", "99999"],
            "99999",
        ),
        Row(
            "8",
            "ray: an address nobody answers",
            ["sglfix", "run", "--executor", "ray", "--device", "cpu", "-s", FAST, "--ray-address", "127.0.0.1:1"],
            "nothing answers there",
        ),
        Row(
            "9",
            "bisect naming a part twice",
            ["sglfix", "bisect", "-r", "26651", "-r", "26651:clamp", "-s", FAST, "--device", "cpu"],
            "already names 26651:clamp",
        ),
        Row(
            "9",
            "bisect --device cuda without a GPU",
            ["sglfix", "bisect", "--device", "cuda", "-s", FAST, "-r", "26738"],
            "--device cuda",
            env={"CUDA_VISIBLE_DEVICES": ""},
        ),
        Row("10", "--toggles ''", ["sglfix", "--toggles", "", "list"], "the directory is empty"),
        Row("10", "doctor --source ''", ["sglfix", "doctor", "--source", ""], "the path is empty"),
        Row(
            "11",
            "doctor --source with a target file that does not parse",
            ["sglfix", "doctor", "--source", str(broken_src)],
            "not valid Python",
            code=1,
        ),
        Row("12", "--allow-target ''", ["sglfix", "--allow-target", "", "list"], "is not a module prefix"),
        Row(
            "12",
            "--allow-target 'not a module!'",
            ["sglfix", "--allow-target", "not a module!", "list"],
            "is not a module prefix",
        ),
        Row(
            "12", "SGLFIX_KERNEL_MEMO_MB=abc", run, "SGLFIX_KERNEL_MEMO_MB='abc'", env={"SGLFIX_KERNEL_MEMO_MB": "abc"}
        ),
        Row("conventions", "--device gpu", [*run[:-2], "--device", "gpu"], "'gpu' is not one of"),
        Row("conventions", "--executor foo", [*run, "--executor", "foo"], "'foo' is not one of"),
        Row(
            "conventions",
            "pytest --sglfix-revert 99999",
            ["pytest", "-p", "no:cacheprovider", "--sglfix-revert", "99999", "-q", str(tmp / "test_x.py")],
            "--sglfix-revert: PR 99999 is not registered",
            code=4,
        ),
        Row(
            "conventions",
            "report compare of a bisect report",
            ["sglfix", "report", "compare", str(CPU_REPORT), str(BISECT_REPORT)],
            "is a bisect report",
        ),
        Row(
            "conventions",
            "report compare with no cell in common",
            ["sglfix", "report", "compare", str(only_a), str(only_b)],
            "no cell in common",
        ),
    ]
    return out + _rows_34(tmp, report) + _rows_54(tmp)


def _rows_34(tmp: Path, report: dict) -> list[Row]:
    """The last bad inputs (issue 34, items 8-14)."""
    run = ["sglfix", "run", "-s", FAST, "--device", "cpu"]
    merged = str(tmp / "merged-34.json")
    sglang = json.loads(SGLANG_REPORT.read_text())
    known = sglang["known_divergences"][0]
    costs = dict(report, cells=[dict(c) for c in report["cells"][:4]])
    costs["cells"][1]["timings_ms"] = {"total": "@"}
    nan_costs = tmp / "nan-costs.json"
    nan_costs.write_text(json.dumps(costs).replace('"@"', "NaN"))
    quiet = _silent_listener()
    signal_dir = tmp / "sigterm"
    signal_dir.mkdir()
    diffs = _diffs_34(tmp)

    def merge_row(what: str, path: Path) -> Row:
        return Row(
            "34.9",
            what,
            ["sglfix", "report", "merge", str(path), "-o", merged, "--gate"],
            str(path),
            must_not_exist=[merged],
        )

    return [
        Row("34.8", "--jobs above the ceiling", [*run, "-j", "100000"], "at most"),
        merge_row(
            "known divergence with a string verdict",
            _damaged(tmp, sglang, "known", known_divergences=[{**known, "verdict": "INVARIANT"}]),
        ),
        merge_row(
            "known divergence on device gpu",
            _damaged(tmp, sglang, "device", known_divergences=[{**known, "device": "gpu"}]),
        ),
        merge_row("shard 0/2", _damaged(tmp, sglang, "shard", shard="0/2")),
        merge_row("wall_s NaN", _damaged(tmp, sglang, "wall", wall_s=float("nan"))),
        merge_row(
            "expectation row without its keys",
            _damaged(tmp, sglang, "expect", expect=[{"revert": "26738", "scenario": "x", "wanted": ["CRASH"]}]),
        ),
        merge_row("codebase not an object", _damaged(tmp, sglang, "codebase", codebase=7)),
        merge_row("executor unknown", _damaged(tmp, sglang, "executor", executor=["ray"])),
        merge_row("worker_replacements not a list", _damaged(tmp, sglang, "replacements", worker_replacements=3)),
        merge_row(
            "kernel_memo with a text flag",
            _damaged(tmp, sglang, "memo", kernel_memo={"memo": "yes", "launches": 1, "hits": 0}),
        ),
        merge_row("a misspelt top-level key", _damaged(tmp, sglang, "unknown", exeutor={"name": "local"})),
        Row(
            "34.10",
            "--shard-costs with a NaN timing",
            ["sglfix", "matrix", "--shard", "1/2", "--shard-costs", str(nan_costs), "-s", FAST, "--device", "cpu"],
            "not durations",
        ),
        Row(
            "34.11",
            "--ray-address that accepts TCP but is not Ray",
            [*run, "--executor", "ray", "--ray-address", f"127.0.0.1:{quiet}"],
            "is not a Ray head",
        ),
        Row(
            "34.11",
            "ray-workers at an address that accepts TCP but is not Ray",
            ["sglfix", "ray-workers", "--ray-address", f"127.0.0.1:{quiet}"],
            "is not a Ray head",
        ),
        Row(
            "34.13",
            "SIGTERM while a report is written",
            ["python", "-c", _sigterm_during_write(SGLANG_REPORT, signal_dir / "merged.json")],
            "",
            code=143,
            empty_dir=str(signal_dir),
        ),
        Row("34.6", "from-diff of a diff that changes no code", [*diffs["comment"]], "changes no code"),
        Row("34.7", "from-diff of an empty file", [*diffs["empty"]], "is empty"),
        Row(
            "34.7",
            "doctor --source on a folder of the wrong layout",
            ["sglfix", "doctor", "--source", str(ROOT / "backends")],
            "has no sglfix/backends/ folder",
        ),
        Row("34.12", "from-diff with a path climbing above the root", [*diffs["climb"]], "climbs above"),
        Row("34.14", "from-git of a commit whose diff is not UTF-8", [*diffs["latin1"]], "is not UTF-8 text"),
        Row("34.14", "--devices ²", ["sglfix", "run", "-s", FAST, "--devices", "²"], "is not a CUDA device"),
        Row("34.14", "schema without a kind", ["sglfix", "schema"], "Missing argument"),
    ]


# Python run before ``report merge`` in a process of its own: the SIGTERMs of cause 54.11 (also
# tests/cli/test_words_and_limits.py's).
SIGTERM_SCRIPTS = {
    # To a thread other than the writing one (Python runs the handler in the writing one anyway).
    "thread": (
        "import os, signal, tempfile, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "real = tempfile.mkstemp\n"
        "def mkstemp(*a, **k):\n"
        "    made = real(*a, **k)\n"
        "    if k.get('suffix') == '.tmp':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "    return made\n"
        "tempfile.mkstemp = mkstemp\n"
    ),
    # Once as the temporary file is created, again as its removal starts.
    "twice": (
        "import os, signal, tempfile\n"
        "real, real_unlink = tempfile.mkstemp, os.unlink\n"
        "def mkstemp(*a, **k):\n"
        "    made = real(*a, **k)\n"
        "    if k.get('suffix') == '.tmp':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return made\n"
        "def unlink(path, *a, **k):\n"
        "    if str(path).endswith('.tmp'):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real_unlink(path, *a, **k)\n"
        "tempfile.mkstemp = mkstemp\n"
        "os.unlink = unlink\n"
    ),
}


def _diffs_54(tmp: Path) -> dict[str, str]:
    """Candidate fixes and toggle diffs for the rows of cause 54: a fix that changes nothing
    (``o = torch.zeros_like(q)`` in the reproduction's Triton decode), the same diff written
    against another version (its context not in the code), a binary diff, a file with NUL bytes,
    a diff that only adds a file, and the 26651:clamp diff with . and .. segments in its paths."""
    import difflib

    rel = "backends/srt/layers/attention/triton_backend.py"
    post = (ROOT / rel).read_text()
    old = "        o = torch.empty_like(q)\n        if save_kv_cache:\n            forward_batch.token_to_kv_pool.set_kv_buffer(\n"
    assert post.count(old) == 1

    def diff(pre: str, after: str, path: str = rel) -> str:
        return "".join(difflib.unified_diff(pre.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))

    out = {}

    def write(name: str, text: str | bytes) -> None:
        f = tmp / name
        (f.write_bytes if isinstance(text, bytes) else f.write_text)(text)
        out[name.split(".")[0]] = str(f)

    benign = diff(post, post.replace(old, old.replace("empty_like", "zeros_like")))
    write("zeros.patch", benign)
    line = " q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)"
    assert benign.count(line) == 1
    write("stale.patch", benign.replace(line, " q = q.view(-1, layer.tp_q_head_num, layer.head_dim)"))
    write(
        "image.patch",
        "diff --git a/backends/srt/logo.png b/backends/srt/logo.png\nindex 1111111..2222222 100644\n"
        "Binary files a/backends/srt/logo.png and b/backends/srt/logo.png differ\n",
    )
    write("nul.patch", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    write("empty.patch", "")
    write(
        "added.patch",
        "diff --git a/backends/srt/extra.py b/backends/srt/extra.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/backends/srt/extra.py\n@@ -0,0 +1,2 @@\n+def helper():\n+    return 1\n",
    )
    clamp = "                kv_lens = torch.clamp(kv_lens, min=0)\n"
    write("dots.patch", diff(post.replace(clamp, "", 1), post, rel.replace("srt/", "srt/layers/../", 1)))
    return out


def _bad_range_profile(tmp: Path) -> Path:
    """A copy of the sglang profile whose 26880 variant has a range no version can be in."""
    folder = tmp / "profiles"
    shutil.copytree(ROOT / "profiles" / "sglang-0.5.23", folder / "sglang-badrange")
    toml = folder / "sglang-badrange" / "profile.toml"
    toml.write_text(toml.read_text().replace('name = "sglang-0.5.23"', 'name = "sglang-badrange"', 1))
    variants = folder / "sglang-badrange" / "variants" / "26880.yaml"
    text = variants.read_text()
    assert "'>=0.5.13,<0.5.14'" in text
    variants.write_text(text.replace("'>=0.5.13,<0.5.14'", "'>>0.5.13'", 1))
    return folder


def _window_scenarios(tmp: Path) -> dict[str, str]:
    """model.sliding_window where it is not supported: on the reproduction (no window layer), and
    on sglang's Triton backend in DECODE (a window runs in EXTEND and DRAFT_EXTEND_V2 only)."""
    out = {}
    for name, mode, extra in (("extend", "EXTEND", "      extend_lens: [5, 9]\n"), ("decode", "DECODE", "")):
        f = tmp / f"window-{name}.yaml"
        f.write_text(
            "scenarios:\n"
            f"  - name: window-{name}\n    backend: triton\n    mode: {mode}\n"
            f"    batch:\n      prefix_lens: [13, 37]\n{extra}"
            "    page_size: 1\n"
            "    model: {num_heads: 4, num_kv_heads: 2, head_dim: 64, dtype: float16, sliding_window: 8}\n"
        )
        out[name] = str(f)
    return out


def _rows_54(tmp: Path) -> list[Row]:
    """Bad input to the options added since cause 34's rows (issue 54, items 11, 13 and 14)."""
    run = ["sglfix", "run", "-s", FAST, "--device", "cpu"]
    sg_run = ["sglfix", "--profile", "sglang-0.5.23", "run", "-s", "sglang-" + FAST, "--device", "cpu"]
    sg_bisect = ["sglfix", "--profile", "sglang-0.5.23", "bisect", "-s", "sglang-" + FAST, "--device", "cpu"]
    port = ["sglfix", "--profile", "sglang-0.5.23", "toggle", "port"]
    d = _diffs_54(tmp)
    windows = _window_scenarios(tmp)
    written = str(tmp / "r54.json")
    sig = {}
    for name in SIGTERM_SCRIPTS:
        sig[name] = tmp / f"sigterm-{name}"
        sig[name].mkdir()
    a_file = tmp / "a-file"
    a_file.write_text("not a folder\n")
    passing = f"baseline::{FAST}"

    def apply_row(what: str, fix: str, needle: str) -> Row:
        out = str(tmp / f"r54-{Path(fix).stem}.json")
        return Row("54.14", what, [*run, "--apply", fix, "--json", out], needle, must_not_exist=[out])

    def from_diff(name: str) -> list[str]:
        return ["sglfix", "toggle", "from-diff", d[name], "--pr", "90001", "-o", str(tmp / f"{name}.yaml")]

    rows = [
        Row(
            "54.11",
            f"SIGTERM {'to another thread' if name == 'thread' else 'twice'} while a report is written",
            [
                "python",
                "-c",
                code + f"from sglfix.cli import main\nmain(['report', 'merge', {str(SGLANG_REPORT)!r}, "
                f"'-o', {str(sig[name] / 'merged.json')!r}])\n",
            ],
            "",
            code=143,
            empty_dir=str(sig[name]),
        )
        for name, code in SIGTERM_SCRIPTS.items()
    ]
    rows += [
        Row(
            "54.13",
            "--expect-fixes that matches no selected scenario",
            [*run, "--apply", d["zeros"], "--expect-fixes", "nope*", "--json", written],
            "matches none of the 1 selected scenario(s)",
            must_not_exist=[written],
        ),
        Row("54.13", "--cache ''", [*run, "--cache", ""], "--cache ''"),
        Row("54.13", "toggle port --versions ''", [*port, "--versions", ""], "--versions ''"),
        Row("54.13", "from-diff of a diff that only adds a file", from_diff("added"), "only adds new files"),
        Row(
            "54.13",
            "from-diff with . and .. segments in its paths (maps as the plain path)",
            from_diff("dots"),
            "1 function(s) in 1 part(s)",
            code=0,
        ),
        apply_row("--apply of a missing file", str(tmp / "missing.patch"), "does not exist"),
        apply_row("--apply of an empty file", d["empty"], "is empty"),
        apply_row("--apply of a binary diff", d["image"], "is a binary file"),
        apply_row("--apply of a file with NUL bytes", d["nul"], "is binary (holds NUL bytes)"),
        apply_row("--apply of a diff that does not apply", d["stale"], "does not apply to the installed code"),
        Row(
            "54.14",
            "report finding of a cell the report lacks",
            ["sglfix", "report", "finding", str(CPU_REPORT), "baseline::nope", "-o", str(tmp / "f.md")],
            "has no cell 'baseline::nope'",
            must_not_exist=[str(tmp / "f.md")],
        ),
        Row(
            "54.14",
            "report finding of a passing cell",
            ["sglfix", "report", "finding", str(CPU_REPORT), passing, "-o", str(tmp / "f.md")],
            "passed: there is no failure to write up",
            must_not_exist=[str(tmp / "f.md")],
        ),
        Row("54.14", "--release of an unknown version", ["sglfix", "--release", "9.9.9", *sg_run[3:]], "9.9.9"),
        Row(
            "54.14",
            "--release of a version no profile covers",
            ["sglfix", "--release", "0.5.12", *sg_run[3:]],
            "no profile covers sglang 0.5.12",
        ),
        Row("54.14", "--release banana", ["sglfix", "--release", "banana", *sg_run[3:]], "is not a version"),
        Row("54.14", "--cache on a file", [*run, "--cache", str(a_file)], "that is a file, not a folder"),
        Row(
            "54.14",
            "--cache on a folder that cannot be written",
            [*run, "--cache", "/proc/sglfix-cache"],
            "--cache /proc/sglfix-cache",
        ),
        Row(
            "54.14", "bisect --releases reversed", [*sg_bisect, "--releases", "0.5.23..0.5.13"], "oldest release first"
        ),
        Row("54.14", "bisect --releases of one release", [*sg_bisect, "--releases", "0.5.13"], "give a range"),
        Row("54.14", "bisect --releases 0.5.13..0.5.13", [*sg_bisect, "--releases", "0.5.13..0.5.13"], "0.5.13"),
        Row("54.14", "bisect --releases to an unknown release", [*sg_bisect, "--releases", "0.5.13..0.5.99"], "0.5.99"),
        Row("54.14", "toggle port --versions banana", [*port, "--versions", "banana"], "is not a version range"),
        Row("54.14", "toggle port --source without sglang/", [*port, "--source", str(tmp)], "--source"),
        Row("54.14", "toggle port without an engine profile", ["sglfix", "toggle", "port"], "--profile sglang-X"),
        Row(
            "54.14",
            "a variant whose versions range does not parse",
            ["sglfix", "--profile", "sglang-badrange", "list"],
            "is not a version range",
            env={"SGLFIX_PROFILES_PATH": str(_bad_range_profile(tmp))},
        ),
        Row(
            "54.14",
            "model.sliding_window on the reproduction (no window layer)",
            ["sglfix", "run", "--scenario-file", windows["extend"], "--device", "cpu"],
            "model.sliding_window",
        ),
        Row(
            "54.14",
            "model.sliding_window in DECODE",
            ["sglfix", "--profile", "sglang-0.5.23", "run", "--scenario-file", windows["decode"], "--device", "cpu"],
            "sets model.sliding_window",
        ),
    ]
    return rows


def _workers_of(pid: int) -> set[int]:
    """Worker processes that descend from ``pid`` (scanned in /proc)."""
    parents: dict[int, int] = {}
    workers = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        if b"sglfix.execution.serve" in cmd:
            workers.add(int(entry))
    found = set()
    for w in workers:
        p = w
        while p > 1:
            p = parents.get(p, 0)
            if p == pid:
                found.add(w)
                break
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited worker waiting for init to reap it holds no resource)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _argv(row: Row) -> list[str]:
    head, rest = row.argv[0], row.argv[1:]
    if head == "sglfix":
        exe = shutil.which("sglfix") or ""
        return [exe, *rest] if exe else [sys.executable, "-m", "sglfix", *rest]
    if head == "pytest":
        return [sys.executable, "-m", "pytest", *rest]
    return [sys.executable, *rest]


def measure(row: Row, *, tmp: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_TOGGLES_DIR", "SGLFIX_PROFILE")
    }
    env.setdefault("COLUMNS", "120")
    env.update(row.env)
    argv = _argv(row)
    seen_workers: set[int] = set()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen_workers.update(_workers_of(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    time.sleep(0.5)
    left = [w for w in seen_workers if _running(w)]
    lines = [line for line in stderr.splitlines() if line.strip()]
    checks = {"exit_code": proc.returncode == row.code, "no_traceback": "Traceback" not in stderr + stdout}
    if row.code == 2 or (row.code == 4 and row.argv[0] == "pytest"):
        checks["one_line"] = len(lines) == 1
        checks["names_the_thing"] = bool(lines) and row.needle in lines[0]
        checks["no_worker_started"] = not seen_workers
    elif row.stdout_has is not None:
        checks["output"] = row.stdout_has in stdout
    elif row.needle:
        checks["output"] = row.needle in stdout + stderr
    checks["nothing_left_running"] = not left
    checks["nothing_written"] = not any(os.path.exists(p) for p in row.must_not_exist) and not (
        row.empty_dir and os.listdir(row.empty_dir)
    )
    return {
        "cause": row.cause,
        "what": row.what,
        "command": " ".join(row.argv).replace(str(tmp), "$TMP"),
        "env": {k: v.replace(str(tmp), "$TMP") for k, v in row.env.items()},
        "exit_code": proc.returncode,
        "wanted_exit_code": row.code,
        "stderr": (lines[0] if len(lines) == 1 else "\n".join(lines))[:400].replace(str(tmp), "$TMP"),
        "wall_s": round(wall, 3),
        "checks": checks,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--limit-s", type=float, default=3.0)
    ns = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="sglfix-refusals-") as name:
        tmp = Path(name)
        for row in rows(tmp):
            r = measure(row, tmp=tmp)
            r["checks"]["within_limit"] = r["wall_s"] <= ns.limit_s
            r["ok"] = all(r["checks"].values())
            results.append(r)
            print(
                f"{'ok ' if r['ok'] else 'BAD'} {r['wall_s']:6.2f} s  [{row.cause:>2}] {row.what}"
                + ("" if r["ok"] else f"  {[k for k, v in r['checks'].items() if not v]} {r['stderr'][:200]}"),
                flush=True,
            )
    walls = sorted(r["wall_s"] for r in results)
    summary = {
        "rows": len(results),
        "ok": sum(r["ok"] for r in results),
        "max_wall_s": walls[-1],
        "median_wall_s": walls[len(walls) // 2],
        "limit_s": ns.limit_s,
    }
    print(
        f"{summary['ok']}/{summary['rows']} rows as promised; wall median {summary['median_wall_s']} s, "
        f"max {summary['max_wall_s']} s (limit {ns.limit_s} s)"
    )
    if ns.json:
        out = {
            "bench": "refusals",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": "python bench/refusals.py --json " + ns.json,
            "machine": {
                "cpu_count": os.cpu_count(),
                "python": platform.python_version(),
                "sglfix": shutil.which("sglfix") or f"{sys.executable} -m sglfix",
            },
            "summary": summary,
            "rows": results,
        }
        Path(ns.json).write_text(json.dumps(relativize(out), indent=1) + "\n")
    return 0 if summary["ok"] == summary["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
