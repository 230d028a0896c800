"""A finding as an upstream issue needs it, in Markdown (``sglfix report finding``): the code base
and versions, the device, the scenario as its file writes it, the command that reproduces it, the
observed and expected figures, the functions of the code base the cell ran (file and line in the
installed tree), and, when a candidate fix clears it, that diff. Rendering only: what it renders
is gathered by ``sglfix.execution.finding``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Finding", "render_finding"]


@dataclass
class Finding:
    cell: dict  # the report's cell (verdict, findings, meaning, why)
    report: dict  # the report it comes from (device, versions, code base)
    report_path: str
    profile: str  # the profile name
    scenario_name: str
    scenario_yaml: str  # the scenario's entry as its file writes it
    scenario_file: str
    reproduce: str  # the command line
    install: str  # how to get the code base
    known: dict | None = None  # the profile's known-divergence entry it matches
    fix_path: str | None = None  # the candidate fix that clears it (the profile's)
    fix_text: str | None = None
    fix_command: str | None = None
    rerun: dict | None = None  # the cell run again here, recording every function it entered
    rerun_note: str = ""  # why it was not run again, or how it compares


def _fence(text: str, lang: str = "") -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _versions(report: dict) -> list[str]:
    cb = report.get("codebase") or {}
    rows = []
    if isinstance(cb, dict):
        where = cb.get("path") or "?"
        name = (
            f"{cb.get('distribution')} {cb.get('version')}" if cb.get("distribution") else "the built-in reproduction"
        )
        rows.append(f"- code base: {name} (`{where}`)")
    for key in ("sglfix", "python", "torch", "triton", "flashinfer"):
        if report.get(key):
            rows.append(f"- {key}: {report[key]}")
    device = report.get("device") or "?"
    name = report.get("device_name")
    rows.append(f"- device: {device}" + (f" ({name})" if name and name != device else ""))
    return rows


def _figures(findings: list[dict]) -> list[str]:
    rows = []
    for f in findings:
        data = {k: v for k, v in f.items() if k not in ("verdict", "message", "traceback")}
        line = f"- **{f.get('verdict')}**: {f.get('message')}"
        if data:
            shown = ", ".join(
                f"{k}={v}" for k, v in data.items() if not isinstance(v, (list, dict)) or len(str(v)) < 200
            )
            if shown:
                line += f" ({shown})"
        rows.append(line)
    return rows or ["- (no findings: the cell passed)"]


def render_finding(f: Finding) -> str:
    cell = f.cell
    verdict = cell.get("verdict")
    key = next((x.get("message") for x in cell.get("findings") or () if x.get("verdict") == verdict), "")
    out = [f"# {f.scenario_name}: {verdict}", "", key, ""]
    if f.known:
        out += ["## What is wrong", "", str(f.known.get("reason", "")).strip(), ""]
    out += ["## Code base and device", "", *_versions(f.report), ""]
    out += [
        "## Reproduce",
        "",
        _fence(f"{f.install}\n{f.reproduce}", "bash"),
        "",
        f"Recorded in `{f.report_path}` (cell `{cell.get('id')}`, profile `{f.profile}`).",
        "",
    ]
    out += [
        "## Observed",
        "",
        *_figures(list(cell.get("findings") or ())),
        "",
        "## Expected",
        "",
        "PASS, which holds when",
        "- the attention output equals attention computed in float32 from the ground-truth K/V the scenario "
        "generated (each query sees its request's prefix, the new tokens up to its own position and, for a "
        "draft branch, that branch's own draft path), within the scenario's tolerance "
        f"({_tolerance(f.scenario_yaml)});",
        "- the metadata the code built is well formed: indptr monotone from 0, lengths >= 0, indices inside "
        "the pool, no write past a buffer's or a row's end (guard zones around every static buffer);",
        "- for a probe of a sizing or bookkeeping function (`probe:`), what the function sized or wrote covers "
        "what the same step needs (the figures above give both).",
        "",
    ]
    out += [f"## Scenario (`{f.scenario_file}`)", "", _fence(f.scenario_yaml, "yaml"), ""]
    if "@" in f.scenario_name:
        point = f.scenario_name.split("@", 1)[1]
        out += [f"The cell is this entry's grid point `{point}` (`-s '{f.scenario_name}'` selects it).", ""]
    out += ["## Code the cell ran", ""]
    reached = (f.rerun or {}).get("reached_at")
    if reached:
        out += [
            f"The functions of the code base the cell entered ({len(reached)}; recorded by running the cell again "
            "with every function of the imported modules watched):",
            "",
            "| function | defined at |",
            "|---|---|",
        ]
        out += [f"| `{name}` | `{where}` |" for name, where in reached.items()]
        out += ["", "Paths are relative to the folder the code base is installed in (site-packages).", ""]
    if f.rerun_note:
        out += [f.rerun_note, ""]
    if f.fix_text:
        out += [
            "## A candidate fix",
            "",
            f"`{f.fix_path}` clears it; check it with:",
            "",
            _fence(f.fix_command or "", "bash"),
            "",
            _fence(f.fix_text, "diff"),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def _tolerance(yaml_text: str) -> str:
    for line in yaml_text.splitlines():
        if line.strip().startswith("tolerance:"):
            return line.split(":", 1)[1].strip()
    return "by dtype: 1e-2 for float16/bfloat16, 1e-4 for float32"
