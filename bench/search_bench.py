"""``sglfix search`` against what it must find: the live bugs a hand-written probe found, and a
scenario for each toggle part of a catalogue, from the generic space alone (no built-in scenario is
in it). Each search is a whole ``python -m sglfix search`` process, timed from outside; its report,
the shrunk scenario it wrote, and whether that scenario fails again through ``sglfix run`` (with the
revert) and passes without it (for a revert) are recorded.

    python bench/search_bench.py --json bench/results/search-cpu.json [--bugs] [--reverts PROFILE ...]
        [--survivors MUTATE_REPORT.json --profile P] [--examples N] [--device cpu|cuda] [--seed K]

With ``--survivors``, a campaign's committed survivors (``sglfix mutate``'s report, or a bench
file with a ``survivors`` list) are each looked up by function, line, operator and change among
the mutants of the installed code base, and searched for with ``--mutant`` (one shared result
store: an example's base cell runs once for all); a kill is replayed as ``sglfix run
--scenario-file FOUND --apply MUTANT.patch`` (``mutate --show``'s diff), which must show the cell
moved as the search said (broken, or for a mutant that makes a failing cell pass, cleared).
With ``--apply FIX`` (repeatable) every search runs atop those candidate fixes (``search --mutant
ID --apply FIX``: the survivors of ``mutate --apply``), and a kill is replayed atop them too: the
found scenario's cell with the fixes and the mutant must differ from its cell with the fixes alone.

Exit 1 when a recorded shrunk scenario does not fail again as the search said.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize

# name -> (the global options, the search options, what it must show)
BUGS = {
    "req-to-token-headroom-ps1-tree": (
        ["--profile", "sglang-0.5.23"],
        ["--family", "probes", "--mode", "DECODE"],
        "the req_to_token headroom bug at page size 1 with tree drafting (topk > 1)",
    ),
    "draft-extend-view-bucket": (
        ["--profile", "sglang-0.5.23"],
        ["--family", "probes", "--mode", "DRAFT_EXTEND_V2"],
        "the spec-v2 draft-extend replay view (padding rows of the bucket)",
    ),
    "fimla-draft-planned-from-seq-lens": (
        ["--profile", "sglang-0.5.23"],
        ["--family", "flashinfer_mla", "--mode", "DRAFT_DECODE"],
        "FlashInfer-MLA's multi-step draft planned from seq_lens (on CPU over the same plan; the H200 run is gpu_run.sh ONLY=search)",
    ),
    # The tree bug at page size 1 is in 0.5.14 too and is found first; pinning chain drafting
    # (topk 1) looks past it.
    "chain-paged-overflow-0.5.14": (
        ["--release", "0.5.14"],
        ["--family", "probes", "--mode", "DECODE", "--where", "spec.topk=1"],
        "the 0.5.13-0.5.15 chain-drafting overflow at page size > 1 (fixed in 0.5.16)",
    ),
}
# A bug fixed in a later release: its shrunk scenario must pass there.
FIXED_IN = {"chain-paged-overflow-0.5.14": "0.5.16"}


def sglfix(*args: str, cwd: str, timeout: float = 3600) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )
    return r.returncode, r.stdout, r.stderr, round(time.perf_counter() - start, 2)


def one(name: str, glob: list[str], opts: list[str], *, revert: str | None, common: list[str], work: Path) -> dict:
    out, report = work / f"{name}.yaml", work / f"{name}.json"
    args = [*glob, "search", *opts, *(["-r", revert] if revert else []), *common, "-o", str(out), "--json", str(report)]
    code, _, stderr, wall = sglfix(*args, cwd=str(work))
    row: dict = {"command": "sglfix " + " ".join(args), "exit": code, "process_s": wall}
    if not report.exists():
        row["error"] = stderr.strip().splitlines()[-1:] or [f"exit {code}"]
        return row
    data = json.loads(report.read_text())
    row.update({k: data[k] for k in ("tried", "examples_per_s", "search_s", "wall_s", "stopped", "errors")})
    row["found"] = data["found"] and {k: data["found"][k] for k in ("name", "verdict", "key_figure")}
    row["shrunk"] = data["shrunk"] and {
        k: data["shrunk"][k] for k in ("name", "verdict", "check", "key_figure", "node")
    }
    row["shrink"] = data["shrink"]
    if data["shrunk"] is not None:
        device = common[common.index("--device") + 1]
        again = [*glob, "run", "--scenario-file", str(out), "--device", device, "--no-cache"]
        with_revert = sglfix(*again, *(["-r", revert] if revert else []), cwd=str(work))
        row["replayed"] = {"fails": with_revert[0] == 1 and data["shrunk"]["verdict"] in with_revert[1]}
        if revert:
            without = sglfix(*again, cwd=str(work))
            row["replayed"]["passes_without_revert"] = without[0] == 0
    return row


def survivor_ids(path: str, *, profile: str, skip_families: set[str]) -> list[dict]:
    """The survivors of a campaign's report with their mutant ids on the installed code base (the
    committed summary names them by function, line, operator and change, not by id)."""
    from sglfix.execution.mutate import mutants_on_surface
    from sglfix.toggling.profiles import resolve_profile

    data = json.loads(Path(path).read_text())
    rows = [r for r in data.get("survivors", data.get("mutants", [])) if r.get("status") == "survived"]
    # A later run of the same campaign's survivors (an ``after_<commit>`` section, mutate --again
    # on a newer sglfix) that no longer calls one a survivor supersedes the campaign's word.
    since = {
        mid: m.get("status")
        for key, section in data.items()
        if key.startswith("after_") and isinstance(section, dict)
        for mid, m in (section.get("mutants") or {}).items()
    }
    rows = [r for r in rows if since.get(r.get("id"), "survived") == "survived"]
    rows = [r for r in rows if r.get("family") not in skip_families]
    codebase = resolve_profile(option=profile).profile
    root = codebase.package + ".srt."
    by_function: dict[str, list] = {}
    out = []
    for r in rows:
        function = r["function"] if r["function"].startswith(codebase.package + ".") else root + r["function"]
        if function not in by_function:
            by_function[function] = mutants_on_surface(codebase=codebase, functions=(function,))
        hits = [
            m
            for m in by_function[function]
            if m.line == r["line"] and m.operator == r["operator"] and m.mutated.strip() == r["mutated"].strip()
        ]
        if len(hits) != 1 and r.get("id"):
            # A change over several lines is kept shortened in a summary: its id then names it.
            hits = [m for m in by_function[function] if m.id == r["id"]]
        out.append({**r, "function": function, "id": hits[0].id if len(hits) == 1 else None, "matches": len(hits)})
    return out


def _where(row: dict) -> tuple:
    """A survivor as a campaign's summary names it (its function under the package's srt, line,
    operator and change): how an earlier output's rows are matched to this campaign's."""
    return row["function"].split(".srt.")[-1], row["line"], row["operator"], row["mutated"]


def replayed(meaning: str, ran: tuple[int, str, str, float], report: Path) -> dict:
    """Whether ``run --apply`` of the mutant on its shrunk scenario shows what the search said:
    its patched cell judged as the search judged it (BROKEN, CHANGED or FIXED), read from the
    run's own report (its exit alone cannot tell: a CHANGED cell fails with and without the
    mutant, and its baseline's failure exits 1 either way)."""
    code = ran[0]
    cells = json.loads(report.read_text())["cells"] if report.exists() else []
    patched = [c.get("meaning") for c in cells if any(str(t).startswith("+") for t in c.get("toggles") or ())]
    return {"exit": code, "patched": patched, "shows": meaning.lower() in patched, "as": meaning.lower()}


def replayed_atop(fixes: list[str], patch: Path, found: Path, *, glob: list[str], device: str, work: Path) -> dict:
    """Whether the found scenario's cell atop ``fixes`` moves with the mutant as well, judged as
    mutate and search judge a mutant's cell against its base: another verdict, or (a cell that
    fails either way) a failure on other rows or of another check (``fails_otherwise``). Each
    cell is read from its run's own report (the patched cell)."""
    from sglfix.report.context import key_figure
    from sglfix.report.outcome import fails_otherwise

    seen, cells = {}, {}
    for name, extra in (("fixes", []), ("mutant", ["--apply", str(patch)])):
        rep = work / f"{patch.stem}-atop-{name}.json"
        args = [*glob, "run", "--scenario-file", str(found), *(a for f in fixes for a in ("--apply", f)), *extra]
        code = sglfix(*args, "--device", device, "--no-cache", "--json", str(rep), cwd=str(work))[0]
        ran = json.loads(rep.read_text())["cells"] if rep.exists() else []
        cells[name] = [c for c in ran if any(str(t).startswith("+") for t in c.get("toggles") or ())]
        seen[name] = {"exit": code, "cells": [[c.get("verdict"), key_figure(c)] for c in cells[name]]}
    pairs = list(zip(cells["mutant"], cells["fixes"]))
    moved = [
        m.get("verdict") != f.get("verdict") or (m.get("verdict") != "PASS" and fails_otherwise(m, f) is not None)
        for m, f in pairs
    ]
    return {**seen, "shows": bool(pairs) and any(moved), "atop": len(fixes)}


def kill(row: dict, *, profile: str, common: list[str], store: Path, work: Path, fixes: list[str] = ()) -> dict:
    """One survivor searched for with --mutant (atop ``fixes``); a kill replayed through run --apply."""
    mid, function = row["id"], row["function"]
    out, report = work / f"{mid}.yaml", work / f"{mid}.json"
    glob = ["--profile", profile]
    atop = [a for f in fixes for a in ("--apply", f)]
    args = [*glob, "search", "--mutant", mid, "--function", function, *atop, *common, "--cache", str(store)]
    args += ["-o", str(out), "--json", str(report)]
    code, _, stderr, wall = sglfix(*args, cwd=str(work))
    keep = ("family", "function", "line", "operator", "mutated", "id")
    res: dict = {**{k: row[k] for k in keep}, "exit": code, "process_s": wall}
    if not report.exists():
        res["error"] = stderr.strip().splitlines()[-1:] or [f"exit {code}"]
        return res
    data = json.loads(report.read_text())
    res.update({k: data[k] for k in ("tried", "search_s", "stopped", "timeouts", "focus", "device", "skipped")})
    res.update({k: data.get(k) for k in ("seeds", "alive", "neighbours", "origin")})
    if data["tried"] and data["skipped"] == data["tried"]:
        # Nothing ran here (a cell that cannot run on this machine): no search, no survivor.
        res["error"] = [data["stopped"]]
        return res
    res["errors"] = len(data["errors"])
    final = data["shrunk"] or data["found"]
    res["killed"] = final is not None
    if final is not None:
        res["by"] = {k: final[k] for k in ("name", "meaning", "said", "node")}
        res["shrink"] = data["shrink"]
        patch = work / f"{mid}.patch"
        shown = sglfix(*glob, "mutate", "--show", mid, "--function", function, cwd=str(work))
        patch.write_text(shown[1])
        if fixes:
            device = common[common.index("--device") + 1]
            res["replayed"] = replayed_atop(list(fixes), patch, out, glob=glob, device=device, work=work)
            return res
        again = sglfix(
            *glob,
            "run",
            "--scenario-file",
            str(out),
            "--apply",
            str(patch),
            "--device",
            common[common.index("--device") + 1],
            "--no-cache",
            "--json",
            str(work / f"{mid}-replay.json"),
            cwd=str(work),
        )
        res["replayed"] = replayed(res["by"]["meaning"], again, work / f"{mid}-replay.json")
    return res


def survivors_figure(killed: list[dict], *, args: argparse.Namespace, of: int) -> dict:
    """The share of a campaign's survivors the searches killed, by family, with every row."""
    searched = [r for r in killed if "error" not in r]
    n = len(searched)
    k = sum(1 for r in searched if r.get("killed"))
    return {
        "from": args.survivors,
        "profile": args.profile,
        "skipped_families": args.skip_family,
        "budget": {"examples": args.examples, "time_s": args.time},
        "atop": [Path(f).name for f in args.apply],
        "survivors": of,
        "searched": n,
        "not_searched": len(killed) - n,
        "killed": k,
        "share": round(k / n, 3) if n else None,
        "by_family": {
            f: {
                "searched": sum(1 for r in searched if r["family"] == f),
                "killed": sum(1 for r in searched if r["family"] == f and r.get("killed")),
            }
            for f in sorted({r["family"] for r in killed})
        },
        "rows": killed,
    }


def parts_of(profile: str, device: str = "cpu") -> dict[str, bool]:
    """Every part id of every toggle of ``profile`` (a whole toggle where it has one part) -> whether
    the catalogue expects some scenario to show it reverted alone on ``device`` (a part whose every
    expectation alone is PASS, a refactor or an assertion its sizing part keeps from firing, shows
    nothing by design, and one shown only on another device, e.g. a CUDA-only kernel's, shows
    nothing here: both are left out of the share)."""
    code, stdout, stderr, _ = sglfix("--profile", profile, "list", "--json", cwd=".")
    if code != 0:
        raise SystemExit(f"sglfix list failed: {stderr}")
    out: dict[str, bool] = {}
    for toggle in json.loads(stdout)["toggles"]:
        parts = toggle.get("parts") or []
        ids = [f"{toggle['id']}:{p}" for p in parts] if len(parts) > 1 else [str(toggle["id"])]
        code, shown, stderr, _ = sglfix("--profile", profile, "show", str(toggle["id"]), "--json", cwd=".")
        expect = json.loads(shown).get("expect") or [] if code == 0 else []
        for rid in ids:
            alone = [e for e in expect if e.get("revert") in ([rid], [str(toggle["id"])] if len(ids) == 1 else [rid])]
            out[rid] = any(e.get("verdict") != ["PASS"] and e.get("device") in (None, "any", device) for e in alone)
    return out


def share_of(rows: dict) -> dict:
    """A catalogue's figure: of the parts the catalogue expects some scenario to show alone, how
    many a search found; the others are listed apart."""
    showable = {k: r for k, r in rows.items() if r["catalogue_expects_it_shown"]}
    found = sum(1 for r in showable.values() if r.get("found"))
    return {
        "parts": len(rows),
        "showable": len(showable),
        "found": found,
        "share": round(found / len(showable), 3) if showable else None,
        "shows_nothing_alone_here": sorted(set(rows) - set(showable)),
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--bugs", action="store_true")
    ap.add_argument("--reverts", nargs="*", default=[], metavar="PROFILE")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--survivors", metavar="MUTATE_REPORT.json")
    ap.add_argument("--profile", default="sglang-0.5.23")
    ap.add_argument("--skip-family", action="append", default=[], help="families whose kernels cannot run here")
    ap.add_argument("--time", type=float, default=None, help="each search's --time")
    ap.add_argument("--limit", type=int, default=None, help="only the first N survivors (a trial)")
    ap.add_argument("--family", action="append", default=[], help="with --survivors: only these families")
    ap.add_argument(
        "--match",
        action="append",
        default=[],
        help="with --survivors: only functions whose dotted name holds one of these",
    )
    ap.add_argument(
        "--id", action="append", default=[], metavar="MUTANT", help="with --survivors: only these mutants (repeatable)"
    )
    ap.add_argument(
        "--search-opt",
        action="append",
        default=[],
        metavar="OPT",
        help="with --survivors: one more option word for each search (--search-opt=--where --search-opt=K=V)",
    )
    ap.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="with --survivors or --reverts: every N-th survivor or part from the I-th (1-based)",
    )
    ap.add_argument(
        "--after",
        metavar="JSON",
        help="with --survivors: an earlier output of this bench; its rows are kept and their mutants not searched again",
    )
    ap.add_argument(
        "--apply",
        action="append",
        default=[],
        metavar="FIX",
        help="with --survivors: every search (and its replay) atop this candidate fix (repeatable)",
    )
    ap.add_argument("--rescore", metavar="JSON", help="recompute the catalogue shares of an earlier output")
    ap.add_argument("--only", nargs="*", default=None, metavar="PART", help="with --reverts: only these part ids")
    ap.add_argument(
        "--showable", action="store_true", help="with --reverts: only the parts the catalogue expects shown on --device"
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="combine the --reverts outputs of several shards (--shard I/N) into --json, one figure per catalogue",
    )
    args = ap.parse_args()
    if args.merge:
        shards = [json.loads(Path(f).read_text()) for f in args.merge]
        merged = {**shards[0], "reverts": {}, "merged_from": len(shards)}
        for profile in {p for d in shards for p in d["reverts"]}:
            rows = {rid: row for d in shards for rid, row in d["reverts"].get(profile, {}).get("rows", {}).items()}
            merged["reverts"][profile] = share_of(dict(sorted(rows.items())))
        Path(args.json).write_text(json.dumps(relativize(merged), indent=1) + "\n")
        return 0
    if args.rescore:
        data = json.loads(Path(args.rescore).read_text())
        for profile, share in data["reverts"].items():
            shows = parts_of(profile, data["device"])
            rows = {
                rid: {**row, "catalogue_expects_it_shown": shows.get(rid, False)} for rid, row in share["rows"].items()
            }
            data["reverts"][profile] = share_of(rows)
        Path(args.json).write_text(json.dumps(relativize(data), indent=1) + "\n")
        return 0
    common = ["--device", args.device, "--examples", str(args.examples), "--seed", str(args.seed), "--no-cache"]
    result: dict = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "device": args.device,
        "examples_budget": args.examples,
        "seed": args.seed,
        "bugs": {},
        "reverts": {},
    }
    bad = 0
    with tempfile.TemporaryDirectory(prefix="sglfix-search-") as tmp:
        work = Path(tmp)
        if args.bugs:
            for name, (glob, opts, what) in BUGS.items():
                row = one(name, glob, opts, revert=None, common=common, work=work)
                row["what"] = what
                if name in FIXED_IN and row.get("shrunk"):
                    found = work / f"{name}.yaml"
                    fixed = sglfix("--release", FIXED_IN[name], "run", "--scenario-file", str(found), "--device",
                                   args.device, "--no-cache", cwd=str(work))  # fmt: skip
                    row["replayed"][f"passes_on_{FIXED_IN[name]}"] = fixed[0] == 0
                    bad += fixed[0] != 0
                result["bugs"][name] = row
                bad += bool(row.get("shrunk")) and not row["replayed"]["fails"]
                print(name, "found" if row.get("found") else "not found", row.get("process_s"), flush=True)
        for profile in args.reverts:
            rows = {}
            parts = parts_of(profile, args.device)
            chosen = [
                rid for rid in parts if (args.only is None or rid in args.only) and (parts[rid] or not args.showable)
            ]
            if args.shard:
                i, n = (int(x) for x in args.shard.split("/"))
                chosen = chosen[i - 1 :: n]
            for rid in chosen:
                shows = parts[rid]
                row = one(
                    f"{profile}-{rid.replace(':', '-')}",
                    ["--profile", profile],
                    [],
                    revert=rid,
                    common=common,
                    work=work,
                )
                row["catalogue_expects_it_shown"] = shows
                rows[rid] = row
                if row.get("shrunk"):
                    bad += not (row["replayed"]["fails"] and row["replayed"]["passes_without_revert"])
                print(profile, rid, "found" if row.get("found") else "not found", row.get("process_s"), flush=True)
                # Written after every part: a run cut short keeps what it measured.
                result["reverts"][profile] = share_of(rows)
                Path(args.json).write_text(json.dumps(relativize(result), indent=1) + "\n")
            result["reverts"][profile] = share_of(rows)
        if args.survivors:
            store = work / "store"
            opts = [*common[:-1], *(["--time", str(args.time)] if args.time else []), *args.search_opt]  # store shared
            rows = survivor_ids(args.survivors, profile=args.profile, skip_families=set(args.skip_family))
            of = len(rows)
            rows = [r for r in rows if not args.family or r["family"] in args.family]
            rows = [r for r in rows if not args.match or any(m in r["function"] for m in args.match)]
            rows = [r for r in rows if not args.id or r["id"] in args.id]
            killed = json.loads(Path(args.after).read_text())["survivors"]["rows"] if args.after else []
            done = {_where(r) for r in killed}
            rows = [r for r in rows if _where(r) not in done]
            if args.shard:
                i, n = (int(x) for x in args.shard.split("/"))
                rows = rows[i - 1 :: n]
            for row in rows[: args.limit]:
                if row["id"] is None:
                    killed.append({**row, "error": f"{row['matches']} mutants match it on the installed code"})
                    continue
                fixes = [str(Path(f).resolve()) for f in args.apply]
                res = kill(row, profile=args.profile, common=opts, store=store, work=work, fixes=fixes)
                killed.append(res)
                bad += bool(res.get("killed")) and not res["replayed"]["shows"]
                # Written after every mutant: a campaign cut short keeps what it measured.
                result["survivors"] = survivors_figure(killed, args=args, of=of)
                Path(args.json).write_text(json.dumps(relativize(result), indent=1) + "\n")
                print(
                    row["family"],
                    row["id"],
                    "killed" if res.get("killed") else "survived",
                    res.get("process_s"),
                    flush=True,
                )
    Path(args.json).write_text(json.dumps(relativize(result), indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
