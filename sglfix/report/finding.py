"""A finding as an upstream issue needs it, in Markdown (``sglfix report finding``): the code base
and versions (sglfix's commit among them), the device, the scenario as its file writes it, how to
install exactly what ran and the command that reproduces it, the observed figures and what PASS
requires (the judge's tolerance and reference dtype), the functions of the code base the cell ran
(file and line below the folder that holds the package), and, when a candidate fix clears it, that
diff. Rendering only: what it renders is gathered by ``sglfix.execution.finding``, and no path in
it names a folder of the machine that wrote it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Finding", "render_finding"]


@dataclass
class Finding:
    cell: dict  # the report's cell (verdict, findings, meaning, why)
    report: dict  # the report it comes from (device, versions, code base)
    report_path: str  # as shown: relative, never a folder of this machine
    profile: str  # the profile name
    scenario_name: str
    scenario_yaml: str  # the scenario's entry as its file writes it
    scenario_file: str  # as shown: relative to sglfix's source tree, or the file's name
    reproduce: str  # the command line
    install: list[str]  # the lines that install what it needs (comments first)
    expected: dict  # what PASS requires (sglfix.execution.finding._expected)
    sglfix_source: dict = field(default_factory=dict)  # version, commit, modified, url
    sglfix_source_of: str = "report"  # "report", or "writer" where the report records none
    release: str | None = None  # the engine release reproduced with --release (not the profile's own)
    package: str = ""  # the code base's package (paths in the listing are below its folder)
    scenario_given: bool = False  # the scenario came from --scenario-file, not the profile
    known: dict | None = None  # the profile's known-divergence entry it matches
    fix_path: str | None = None  # the candidate fix that clears it (the profile's)
    fix_text: str | None = None
    fix_command: str | None = None
    fix_written_for: str | None = None  # the release the fix is written for, when not the report's
    rerun: dict | None = None  # the cell run again here, recording every function it entered
    rerun_note: str = ""  # why it was not run again, or how it compares
    # Folders of the machines that ran and wrote it, each with what a reader sees instead ("" for
    # the folder that holds a package): a message that quotes a file names it relative to them.
    machine_folders: list[tuple[str, str]] = field(default_factory=list)


def _fence(text: str, lang: str = "") -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _versions(f: Finding) -> list[str]:
    report = f.report
    cb = report.get("codebase") or {}
    rows = []
    if isinstance(cb, dict):
        if cb.get("distribution"):
            line = f"- code base: {cb.get('distribution')} {cb.get('version')}"
            if f.release:
                line += f" (its release's files, as `sglfix --release {f.release}` fetches them)"
        else:
            line = "- code base: the built-in reproduction (sglfix's `backends/`)"
        if cb.get("standins"):
            line += f"; {', '.join(cb['standins'])} not installed where it ran (sglfix stood in)"
        rows.append(line)
    rows.append(f"- sglfix: {_sglfix_line(f)}")
    for key in ("python", "torch", "triton", "flashinfer"):
        if report.get(key):
            rows.append(f"- {key}: {report[key]}")
    device = report.get("device") or "?"
    name = report.get("device_name")
    rows.append(f"- device: {device}" + (f" ({name})" if name and name != device else ""))
    return rows


def _sglfix_line(f: Finding) -> str:
    src = f.sglfix_source
    text = str(src.get("version") or f.report.get("sglfix") or "?")
    commit = src.get("commit")
    if f.sglfix_source_of != "report":
        text = str(f.report.get("sglfix") or "?") + " (the report records no commit of it)"
        if commit:
            text += f"; this finding was written by sglfix {src.get('version')} at commit `{commit}`"
        return text
    text += f", commit `{commit}`"
    if src.get("modified"):
        text += f" with {src['modified']} file(s) changed from it"
    return text


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
    out += ["## Code base and device", "", *_versions(f), ""]
    out += ["## Reproduce", "", _fence("\n".join([*f.install, f.reproduce]), "bash"), ""]
    if f.release:
        out += [
            f"`--release {f.release}` runs {_engine(f)} {f.release}'s own files, which sglfix fetches once into "
            "its cache (nothing of it is installed).",
            "",
        ]
    if f.scenario_given:
        out += [f"`{f.scenario_file}` is the scenario entry below, saved as a file.", ""]
    out += [f"Recorded in `{f.report_path}` (cell `{cell.get('id')}`, profile `{f.profile}`).", ""]
    out += ["## Observed", "", *_figures(list(cell.get("findings") or ())), ""]
    out += ["## Expected", "", "PASS, which holds when", *_expected(f.expected), ""]
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
        out += ["", _listing_note(f), ""]
    if f.rerun_note:
        out += [f.rerun_note, ""]
    if f.fix_text:
        written = (
            f" on {_engine(f)} {f.fix_written_for}, the release it is written for (on {f.release} it may not "
            "apply as it is)"
            if f.fix_written_for
            else ""
        )
        out += [
            "## A candidate fix",
            "",
            f"`{f.fix_path}` (in sglfix's source tree; the diff is below) clears it{written}; check it with:",
            "",
            _fence(f.fix_command or "", "bash"),
            "",
            _fence(f.fix_text, "diff"),
            "",
        ]
    return _relative("\n".join(out).rstrip() + "\n", f.machine_folders)


def _relative(text: str, folders: list[tuple[str, str]]) -> str:
    for folder, shown in sorted(folders, key=lambda pair: -len(pair[0])):
        text = text.replace(folder, shown)
    return text


def _engine(f: Finding) -> str:
    cb = f.report.get("codebase")
    return str(cb.get("distribution") if isinstance(cb, dict) and cb.get("distribution") else f.package)


def _listing_note(f: Finding) -> str:
    if f.package.startswith("sglfix."):
        return "Paths are relative to sglfix's source tree."
    where = "the release's folder in sglfix's cache" if f.release else "site-packages"
    return f"Paths are relative to the folder that holds the `{f.package}` package ({where})."


def _expected(e: dict) -> list[str]:
    """What PASS requires of the cell, in the judge's own figures (gathered from its code)."""
    rows = []
    if e.get("probe"):
        rows.append(
            f"- what the probed function (`{e['probe']}`) sized or wrote covers what the same step needs "
            "(the figures above give both);"
        )
    else:
        rows.append(
            f"- the attention output equals attention the reference computes in {e['reference_dtype']} (its dtype "
            f"on {e['device']}) from the ground-truth K/V the scenario generated (each query sees its request's "
            "prefix, the new tokens up to its own position and, for a draft branch, that branch's own draft path), "
            f"within tolerance {e['tolerance']:g} ({e['tolerance_from']}; the scenario's dtype is {e['dtype']}): "
            f"{e['rule']};"
        )
    rows.append(
        "- the metadata the code built is well formed: indptr monotone from 0, lengths >= 0, indices inside "
        "the pool, no write past a buffer's or a row's end (guard zones around every static buffer)."
    )
    return rows
