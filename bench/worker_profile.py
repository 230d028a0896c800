"""Merge the stats the workers of a run wrote under ``SGLFIX_WORKER_PROFILE=DIR`` and print where
their time went: by cumulative time and by own time, with the sum of every worker's wall.

    SGLFIX_WORKER_PROFILE=/tmp/prof sglfix matrix ...; python bench/worker_profile.py /tmp/prof [--top 40]
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import pstats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.folder, "worker-*.prof")))
    if not files:
        raise SystemExit(f"no worker-*.prof in {a.folder}")
    stats = pstats.Stats(files[0])
    for f in files[1:]:
        stats.add(f)
    print(f"{len(files)} workers, {stats.total_tt:.1f} s of profiled time in all")
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats(key).print_stats(a.top)
        print(f"--- by {key}")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-(a.top + 8) * 200 :])


if __name__ == "__main__":
    main()
