"""sglfix's patch engine against sglang's own, side by side, on sglang 0.5.23's registered reverts.

The wheel is downloaded at run time (nothing of sglang is committed) and its target functions are
loaded from their real files without importing sglang (``tests/sglang_wheel.py``). For each YAML
that applies, both engines apply + restore it in turn (A B A B ...); the figures are the first
apply + restore of each engine in this process ("cold": the source read and the compile included)
and the median of the following ones ("warm": what a long-lived worker or a second engine process
pays). Both engines produce equal code objects (``tests/patching/test_sglang_compat.py``).

    python bench/engine_speed.py [--runs 50] [--json bench/results/engine-speed.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sglang_wheel as sw


def _timed(apply, text: str) -> float | None:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # sglang's engine prints a line per patch
        try:
            states = apply(text)
        except Exception:
            return None
        for state in reversed(states):
            state.restore()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from sglfix import apply_patches_from_config as sglfix_apply

    extracted = sw.extract_wheel(sw.fetch_wheel(), Path(tempfile.mkdtemp()))
    rows = []
    with sw.FakeSglang(extracted) as fake:
        sglang_apply = fake.patcher.apply_patches_from_config
        for pr in sorted(extracted.yamls):
            text = extracted.yamls[pr]
            sglang_cold, sglfix_cold = _timed(sglang_apply, text), _timed(sglfix_apply, text)
            if sglang_cold is None or sglfix_cold is None:
                rows.append({"pr": pr, "applies": False})
                print(
                    f"{pr}: does not apply to 0.5.23 (refused by both engines)"
                    if sglang_cold is None and sglfix_cold is None
                    else f"{pr}: refused by one engine only"
                )
                continue
            a, b = [], []
            for _ in range(args.runs):
                a.append(_timed(sglang_apply, text))
                b.append(_timed(sglfix_apply, text))
            row = {
                "pr": pr,
                "applies": True,
                "targets": len(extracted.targets(pr)),
                "sglang_cold_ms": round(sglang_cold * 1e3, 3),
                "sglfix_cold_ms": round(sglfix_cold * 1e3, 3),
                "sglang_warm_median_ms": round(statistics.median(a) * 1e3, 3),
                "sglfix_warm_median_ms": round(statistics.median(b) * 1e3, 3),
            }
            row["warm_ratio"] = round(row["sglfix_warm_median_ms"] / row["sglang_warm_median_ms"], 4)
            row["cold_ratio"] = round(row["sglfix_cold_ms"] / row["sglang_cold_ms"], 4)
            rows.append(row)
    print(
        f"{'pr':>6} {'sglang warm ms':>14} {'sglfix warm ms':>14} {'ratio':>7} {'sglang cold ms':>14} "
        f"{'sglfix cold ms':>14} {'ratio':>7}"
    )
    for r in rows:
        if r["applies"]:
            print(
                f"{r['pr']:>6} {r['sglang_warm_median_ms']:>14} {r['sglfix_warm_median_ms']:>14} {r['warm_ratio']:>7} "
                f"{r['sglang_cold_ms']:>14} {r['sglfix_cold_ms']:>14} {r['cold_ratio']:>7}"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                relativize(
                    {
                        "tool": "sglfix bench/engine_speed.py",
                        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                        "host": platform.node(),
                        "python": sys.version.split()[0],
                        "sglang": sw.SGLANG_VERSION,
                        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                        "runs": args.runs,
                        "rows": rows,
                    }
                ),
                indent=1,
            )
            + "\n"
        )
    applied = [r for r in rows if r["applies"]]
    return 0 if applied and all(r["warm_ratio"] <= 0.2 for r in applied) else 1


if __name__ == "__main__":
    raise SystemExit(main())
