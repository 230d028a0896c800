"""Bisect's run budget on synthetic toggles: 1 and 2 planted culprits among n candidates, and a
culprit masked by another candidate.

Each n gets a throw-away toggles directory of n single-part toggles on the Triton decode path:
the culprits break it (a wrong softmax scale; a halved output), every other toggle is harmless
(a ``pass`` after a line the decode runs, so reachability keeps all of them in the search). In
the masked rows one culprit (a wrong scale) is undone by its neighbour, harmless alone: reverted
together they pass, so no group question that holds both can see the culprit.
``sglfix --toggles DIR bisect`` runs on one decode scenario; the table compares the distinct
toggle sets it searched (``runs``, the baseline not counted) with n (the naive one-at-a-time
matrix) and with ceil(log2 n) + 2, the budget for one culprit.

    python bench/bisect_budget.py [--n 8 16 32 64] [--json bench/results/bisect-budget.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize

SCENARIO = "triton-decode@cg=eager,gpu_only=off"
TARGET = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode"
HARMLESS = {"match": "        md = self.forward_metadata\n", "append": "pass\n"}
CULPRITS = [
    {"match": "            layer.scaling,\n", "replacement": "            layer.scaling * 1.5,\n"},
    {"match": "        return o\n", "replacement": "        return o * 0.5\n"},
]
FIRST_PR = 80001
# A culprit whose wrong scale its masker undoes: alone it fails, with the masker it passes.
MASKED = {
    "match": "            layer.scaling,\n",
    "replacement": "            layer.scaling * (1.0 if getattr(self, '_sglfix_masker', False) else 1.5),\n",
}
MASKER = {"match": "        md = self.forward_metadata\n", "append": "self._sglfix_masker = True\n"}


def write_toggles(directory: Path, n: int, planted: list[int], *, masker: int | None = None) -> None:
    import yaml

    for i in range(n):
        pr = FIRST_PR + i
        if masker is not None and i in planted:
            edit, what = MASKED, f"breaks decode unless {FIRST_PR + masker} is reverted too"
        elif i == masker:
            edit, what = MASKER, "harmless alone, masks the culprit"
        else:
            edit = CULPRITS[planted.index(i)] if i in planted else HARMLESS
            what = "breaks decode" if i in planted else "harmless"
        text = yaml.safe_dump(
            {"pr": pr, "title": f"synthetic {i} ({what})", "patches": [{"target": TARGET, "edits": [edit]}]},
            sort_keys=False,
        )
        (directory / f"{pr}.yaml").write_text(text)


def planted_positions(n: int, k: int) -> list[int]:
    # Spread out and off the halving points, so that no culprit is found by luck of position.
    return [int(n * 0.7)] if k == 1 else [int(n * 0.3), int(n * 0.8)]


def bisect(directory: Path, out: Path) -> tuple[dict, float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglfix",
            "--toggles",
            str(directory),
            "bisect",
            "-s",
            SCENARIO,
            "--device",
            "cpu",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"bisect failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out.read_text()), wall, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for n in args.n:
        for k, masked in ((1, False), (2, False), (1, True)):
            planted = planted_positions(n, k)
            masker = planted[0] - 1 if masked else None  # its neighbour: most halvings keep them together
            with tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp) / "toggles"
                d.mkdir()
                write_toggles(d, n, planted, masker=masker)
                report, wall, code = bisect(d, Path(tmp) / "b.json")
            found = sorted(tuple(c["ids"]) for c in report["culprits"])
            want = sorted((str(FIRST_PR + i),) for i in planted)
            pairs = sorted((m["culprit"], m["masked_by"]) for m in report["masking"])
            named = not masked or (str(FIRST_PR + planted[0]), str(FIRST_PR + masker)) in pairs
            log2n = math.ceil(math.log2(n))
            rows.append(
                {
                    "n": n,
                    "culprits": k,
                    "masked_by": FIRST_PR + masker if masked else None,
                    "planted": [FIRST_PR + i for i in planted],
                    "found": [list(f) for f in found],
                    "masking": [list(p) for p in pairs],
                    "correct": found == want and code == 1 and named,
                    "runs": report["runs"],
                    "ceil_log2_n": log2n,
                    "budget": k * (log2n + 2),
                    "within_budget": masked or report["runs"] <= k * (log2n + 2),
                    "runs_minus_k_log2n": report["runs"] - k * log2n,
                    "naive_runs": n,
                    "masking_runs": report["masking_runs"],
                    "sets_run": report["sets_run"],
                    "cells": report["cells"],
                    "wall_s": round(wall, 1),
                }
            )
            r = rows[-1]
            print(
                f"n={n:3d} culprits={k}{' masked' if masked else ''}: runs {r['runs']:3d} (budget {r['budget']}, "
                f"naive {n}), masking sets {r['masking_runs']}, {r['cells']} cells, {r['wall_s']} s, "
                f"{'found ' + ','.join(map(str, r['planted'])) if r['correct'] else 'WRONG: ' + str(found)}",
                flush=True,
            )
    print()
    print(
        f"{'n':>4} {'culprits':>8} {'masked':>6} {'runs':>5} {'budget':>6} {'+masking':>8} {'naive n':>7} {'correct':>7}"
    )
    for r in rows:
        print(
            f"{r['n']:>4} {r['culprits']:>8} {r['masked_by'] is not None!s:>6} {r['runs']:>5} {r['budget']:>6} "
            f"{r['masking_runs']:>8} {r['naive_runs']:>7} {r['correct']!s:>7}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                relativize(
                    {
                        "tool": "sglfix bench/bisect_budget.py",
                        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                        "host": platform.node(),
                        "scenario": SCENARIO,
                        "device": "cpu",
                        "rows": rows,
                    }
                ),
                indent=1,
            )
            + "\n"
        )
    return 0 if all(r["correct"] and r["within_budget"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
