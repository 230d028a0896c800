"""Which release broke it, measured: ``sglfix bisect --releases`` over real sglang wheels on CPU.

1. **Planted.** A directory of wheels holding real releases and a copy of the 0.5.22 wheel whose
   Triton decode passes half the softmax scale (``layer.scaling * 0.5``), with the light packages
   those releases pin; a cache of its own, so every release is unpacked from those wheels. The
   search must name 0.5.22 as the first release unlike the oldest, in at most ceil(log2 n) + 1
   release runs, and list ``TritonAttnBackend.forward_decode`` among the changed functions the
   differing cells reached, with the planted line in its diff.
   The same over every release 0.5.13..0.5.23 (13 releases: at most 5 runs).
2. **Real.** The same scenarios over the real releases 0.5.21..0.5.23, and over 0.5.13..0.5.23:
   whether any release differs from the oldest.

    python bench/release_bisect.py [--wheels DIR] [--json bench/results/release-bisect-cpu.json]

``--wheels DIR``: where the real sglang wheels are (default: downloaded with pip).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from relpaths import relativize

SCENARIOS = "sglang-triton-decode*"
RELEASES = (
    "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17",
    "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip
BACKEND = "sglang/srt/layers/attention/triton_backend.py"
SHIPPED = "            layer.scaling,\n            k_descale,\n"
PLANTED = "            layer.scaling * 0.5,\n            k_descale,\n"
# What 0.5.13-0.5.23 pin in another version than sglfix's [sglang] extra installs
# (bench/results/releases-cpu.json, "overlay").
LIGHT = (
    "apache-tvm-ffi==0.1.11",
    "apache-tvm-ffi==0.1.9",
    "transformers==5.8.1",
    "compressed-tensors==0.18.0",
    "openai==2.6.1",
    "sentencepiece==0.2.1",
    "xgrammar==0.2.7",
    "xgrammar==0.2.1",
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "huggingface_hub==1.33.0",
)


def _wheel(version: str, source: str | None, dest: Path) -> Path:
    if source:
        found = sorted(Path(source).glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(dest)], check=True
    )
    return sorted(dest.glob(f"sglang-{version}-*.whl"))[0]


def _plant(wheel: Path, dest: Path) -> Path:
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == BACKEND:
                text = data.decode()
                assert text.count(SHIPPED) == 1, "the decode call this bench edits has moved"
                data = text.replace(SHIPPED, PLANTED).encode()
            dst.writestr(info, data)
    return out


def _bisect(releases: str, *, wheels: Path, cache: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("SGLFIX_PROFILE", None)
    if cache is not None:
        env["SGLFIX_CACHE"] = str(cache)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "b.json"
        cmd = [
            sys.executable, "-m", "sglfix", "bisect", "--releases", releases, "--wheels", str(wheels),
            "-s", SCENARIOS, "--device", "cpu", "--json", str(out),
        ]  # fmt: skip
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = round(time.perf_counter() - t0, 1)
        if not out.is_file():
            raise SystemExit(f"bisect gave no report (exit {r.returncode}): {r.stderr[-2000:]}")
        report = json.loads(out.read_text())
    funcs = (report.get("changed_reached") or {}).get("functions") or []
    n = len(report["releases"])
    return {
        "command": "sglfix " + " ".join(cmd[3:-2]),
        "exit": r.returncode,
        "wall_s": wall,
        "releases": report["releases"],
        "release_runs": report["release_runs"],
        "bound": 1 + math.ceil(math.log2(n)),
        "runs": report["runs"],
        "first_bad": report["first_bad"],
        "last_good": report["last_good"],
        "differing_cells": len(report.get("differing_cells") or []),
        "changed_functions": (report.get("changed_reached") or {}).get("changed_functions"),
        "changed_reached": [f["function"] for f in funcs],
        "planted_line_in_diff": any("layer.scaling * 0.5" in f["diff"] for f in funcs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=None, help="a directory holding the real sglang wheels")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="sglfix-bisect-bench-") as tmp:
        base = Path(tmp)
        real, planted, cache = base / "real", base / "planted", base / "cache"
        for d in (real, planted):
            d.mkdir()
        for version in RELEASES:
            wheel = _wheel(version, args.wheels, real)
            if wheel.parent != real:
                os.symlink(wheel, real / wheel.name)
            if version == "0.5.22":
                _plant(wheel, planted)
            else:
                os.symlink(wheel, planted / wheel.name)
        for pin in LIGHT:  # one at a time: two pins of one package are no conflict here
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(planted), pin], check=True
            )
        for w in planted.glob("*.whl"):
            if not w.name.startswith("sglang-") and not (real / w.name).exists():
                shutil.copy(w, real / w.name)
        for releases in ("0.5.21..0.5.23", "0.5.19..0.5.23", "0.5.13..0.5.23"):
            rows[f"planted {releases}"] = _bisect(releases, wheels=planted, cache=cache)
            print(json.dumps(rows[f"planted {releases}"])[:600], flush=True)
        for releases in ("0.5.21..0.5.23", "0.5.13..0.5.23"):
            rows[f"real {releases}"] = _bisect(releases, wheels=real, cache=None)
            print(json.dumps(rows[f"real {releases}"])[:600], flush=True)
    result = {
        "bench": "sglfix bisect --releases on CPU: a regression planted in a copied 0.5.22 wheel, and the real releases",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "host": platform.node()},
        "scenarios": SCENARIOS,
        "planted": PLANTED.strip(),
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(relativize(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
