"""sglang through time on CPU: every release from the one the attention test kit first ships in,
fetched into sglfix's release cache and run the way a user runs it.

For each release:

1. ``sglfix.codebases.releases.fetch_release`` (the index, or ``--wheels DIR``): its Python files
   and the light packages it pins, in a folder put first on ``PYTHONPATH``; nothing installed.
2. Statically, ``sglfix --profile sglang-0.5.23 doctor --source FOLDER --json``: which toggles of
   the newest profile apply to that release's source (its variant there, if it has one), and why
   each other one does not; ``toggle port --source FOLDER``: which parts apply as written, which
   the port re-anchors, which cannot exist there (the release predates the fix) or cannot be ported.
3. ``sglfix --profile sglang matrix --parts --device cpu --json`` with that folder first on the
   path: the profile ``--profile sglang`` picked for the release (or the one line refusing it),
   cells by verdict, the reverts that no longer apply, the wall time and the gate.

    python bench/releases.py [--releases 0.5.13,...] [--wheels DIR] [--json bench/results/releases-cpu.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglfix.codebases.releases import fetch_release, release_env  # noqa: E402

RELEASES = (
    "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17",
    "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip


def _sglfix(*args: str, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sglfix", *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, r


def _static(folder: str, env: dict) -> dict:
    _, r = _sglfix("--profile", "sglang-0.5.23", "doctor", "--source", folder, "--json", env=env)
    try:
        toggles = json.loads(r.stdout)["toggles"]
    except (ValueError, KeyError):
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    drift = {t["id"]: t["error"].splitlines()[0][:300] for t in toggles if not t["ok"]}
    return {"applying": len(toggles) - len(drift), "of": len(toggles), "not_applying": drift}


def _port(folder: str, env: dict) -> dict:
    """What ``toggle port`` says of each part of the newest profile at this release: applies as
    written, ported (its re-anchored variant), absent (the release predates the fix) or not ported."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        _, r = _sglfix("--profile", "sglang-0.5.23", "toggle", "port", "--source", folder, "--json", str(out), env=env)
        if not out.is_file():
            return {"error": (r.stderr or r.stdout).strip()[-500:]}
        data = json.loads(out.read_text())
    return {
        "counts": data["counts"],
        "ported": [p["id"] for p in data["parts"] if p["status"] == "ported"],
        "not_ported": {p["id"]: p["why"][:300] for p in data["parts"] if p["status"] in ("absent", "failed")},
    }


def _matrix(env: dict, jobs: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        extra = ["--jobs", str(jobs)] if jobs else []
        args = ("--profile", "sglang", "matrix", "--parts", "--device", "cpu", *extra, "--json", str(out))
        wall, r = _sglfix(*args, env={**env, "COLUMNS": "200"})
        row: dict = {
            "command": "sglfix " + " ".join(a for a in args if a != str(out)) + " --json F",
            "exit": r.returncode,
        }
        row["wall_s"] = round(wall, 1)
        if not out.is_file():
            lines = [line for line in r.stderr.splitlines() if line.strip()]
            row["refused"] = lines[-1] if lines else r.stdout[-300:]
            return row
        report = json.loads(out.read_text())
    row["verdicts"] = {
        f"{','.join(c['toggles']) or 'baseline'}::{c['scenario']}": c["verdict"] for c in report["cells"]
    }
    cb = report.get("codebase") or {}
    judged = report.get("judged") or {}
    row.update(
        profile=cb.get("name"),
        version_run=cb.get("version"),
        path=cb.get("path"),
        beyond_range=cb.get("beyond_range"),
        cells=len(report["cells"]),
        summary=report["summary"],
        matrix_wall_s=report.get("wall_s"),
        drifted={d["id"]: d["why"] for d in report.get("drifted") or []},
        not_applicable={d["id"]: d["why"] for d in report.get("not_applicable") or []},
        gate=judged.get("outcome"),
        gate_passed=judged.get("passed"),
    )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default=",".join(RELEASES))
    ap.add_argument("--wheels", default=None, help="a directory of wheels instead of the package index")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for version in [v.strip() for v in args.releases.split(",") if v.strip()]:
        t0 = time.perf_counter()
        release = fetch_release("sglang", version, wheels=args.wheels)
        row = {"release": version, "fetch_s": round(time.perf_counter() - t0, 1), "overlay": release.overlay}
        env = release_env(release)
        env.pop("SGLFIX_PROFILE", None)
        row["static"] = _static(release.path, env)
        row["port"] = _port(release.path, env)
        row["matrix"] = _matrix(env, args.jobs)
        rows.append(row)
        m = row["matrix"]
        shown = m.get("gate") or m.get("refused")
        print(
            f"{version:>13}  applying {row['static'].get('applying')}/{row['static'].get('of')}  "
            f"profile {m.get('profile') or '-'}  exit {m['exit']}  {m['wall_s']:>6} s  {shown}",
            flush=True,
        )
    # Each release that ran against the newest that ran: the cells with the same verdict.
    ran = [r for r in rows if r["matrix"].get("verdicts")]
    if ran:
        newest = ran[-1]
        theirs = dict(newest["matrix"]["verdicts"])
        for r in ran:
            mine = r["matrix"].pop("verdicts")
            common = set(mine) & set(theirs)
            r["matrix"]["same_verdicts_as"] = {
                "release": newest["release"],
                "common": len(common),
                "same": sum(mine[k] == theirs[k] for k in common),
            }
    result = {
        "bench": "sglang releases on CPU: static toggle check and the followed-profile matrix per release",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "host": platform.node()},
        "rows": rows,
        "gates_passed": sum(bool(r["matrix"].get("gate_passed")) for r in rows),
        "releases": len(rows),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(relativize(result), indent=1) + "\n")
    return 0 if result["gates_passed"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
