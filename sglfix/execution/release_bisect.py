"""Which release broke it: the first release of a range whose verdicts differ from the oldest's.

Each release runs in a process of its own (``sglfix --release V run``: the release fetched into
sglfix's cache, first on the path of that process and its workers; nothing installed), with
the selected scenarios and reverts. The oldest release is the reference; the search looks for
the first release whose cells differ from it, in log time: with n releases, the oldest and at
most ceil(log2 n) more runs. A release that cannot be tested (no profile covers it, a revert does
not apply there: the run refuses it, exit 2) is stepped over towards the newer end, as
``git bisect skip`` does. Between the last release like the oldest and the first unlike it, the
functions the differing cells reached (reachability names them) are compared in the two
releases' source: the ones that changed are where the regression is.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.report.release_bisect import ChangedFunction, DifferingCell, ReleaseFound, RunRow

__all__ = [
    "Changed",
    "ReleaseRun",
    "ReleaseSearch",
    "changed_functions",
    "parse_range",
    "reached_diff",
    "releases_between",
    "run_release",
]


def parse_range(text: str, *, option: str = "--releases") -> tuple[str, str]:
    """``A..B`` (both ends included) as two versions, or a one-line ConfigError."""
    from sglfix.codebases.releases import check_version

    lo, sep, hi = text.partition("..")
    if not sep or not lo.strip() or not hi.strip():
        raise ConfigError(f"{option} {text!r}: give a range of releases like 0.5.19..0.5.22")
    lo, hi = check_version(lo, option=option), check_version(hi, option=option)
    from packaging.version import Version

    if Version(lo) >= Version(hi):
        raise ConfigError(f"{option} {text}: {lo} is not older than {hi}; give the oldest release first")
    return lo, hi


def releases_between(distribution: str, lo: str, hi: str, *, wheels: str | None) -> list[str]:
    """Every release of ``distribution`` from ``lo`` to ``hi`` (a directory of wheels, else the
    package index), oldest first; both ends must be among them."""
    from packaging.version import InvalidVersion, Version

    found = _versions_in(wheels, distribution) if wheels else _versions_on_index(distribution)
    chosen: list[str] = []
    for v in found:
        try:
            if Version(lo) <= Version(v) <= Version(hi):
                chosen.append(v)
        except InvalidVersion:
            continue
    chosen = sorted(set(chosen), key=Version)
    where = f"in --wheels {wheels}" if wheels else "on the package index"
    for end in (lo, hi):
        if not any(Version(v) == Version(end) for v in chosen):
            raise ConfigError(
                f"--releases: {distribution} {end} is not {where} (there: {', '.join(sorted(found, key=_key)) or 'none'})"
            )
    return chosen


def _key(v: str):
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


def _versions_in(wheels: str, distribution: str) -> list[str]:
    if not os.path.isdir(wheels):
        raise ConfigError(f"--wheels {wheels}: not a directory; name a directory of wheels")
    prefix = distribution.replace("-", "_").lower() + "-"
    return [
        name[len(prefix) :].split("-", 1)[0]
        for name in os.listdir(wheels)
        if name.lower().startswith(prefix) and name.endswith(".whl")
    ]


def _versions_on_index(distribution: str) -> list[str]:
    from sglfix.codebases.releases import versions_on_index

    found = versions_on_index(distribution)
    if found is None:
        raise ConfigError(
            f"--releases: the package index did not list {distribution}'s releases; give --wheels DIR on an "
            "offline machine"
        )
    return found


@dataclass
class ReleaseRun:
    """One release's run: its cells' verdicts, or why it could not be tested."""

    version: str
    verdicts: dict[str, str] = field(default_factory=dict)  # cell id -> verdict
    reached: dict[str, list[str]] = field(default_factory=dict)  # cell id -> functions it reached
    path: str = ""  # where the release's package was
    untestable: str = ""  # the run's one line when it refused the release
    exit: int = 0
    wall_s: float = 0.0

    def differs(self, reference: ReleaseRun) -> list[str]:
        """The cells both ran whose verdict is not the reference's (and cells only one of them has)."""
        keys = set(self.verdicts) | set(reference.verdicts)
        return sorted(k for k in keys if self.verdicts.get(k) != reference.verdicts.get(k))

    def row(self) -> RunRow:
        """The run as the report lists it: its verdicts counted, or why it could not be tested."""
        said = {"untestable": self.untestable} if self.untestable else {"summary": _count(self.verdicts.values())}
        return RunRow(release=self.version, exit=self.exit, wall_s=self.wall_s, path=self.path, **said)


def _count(verdicts) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v] = counts.get(v, 0) + 1
    return counts


@dataclass
class ReleaseSearch:
    """The search over ``releases`` (oldest first) with ``run(version)`` giving one release's run."""

    releases: Sequence[str]
    run: Callable[[str], ReleaseRun]
    say: Callable[[str], None] = lambda line: None
    ran: dict[str, ReleaseRun] = field(default_factory=dict)

    def _run(self, version: str) -> ReleaseRun:
        if version not in self.ran:
            r = self.run(version)
            self.ran[version] = r
            self.say(_describe(r))
        return self.ran[version]

    @property
    def budget(self) -> int:
        """The most release runs the search takes when every release can be tested."""
        return 1 + math.ceil(math.log2(len(self.releases)))

    def search(self) -> ReleaseFound:
        releases = list(self.releases)
        reference = self._run(releases[0])
        if reference.untestable:
            raise ConfigError(
                f"--releases: the oldest release, {releases[0]}, cannot be tested: {reference.untestable}"
            )
        # lo: like the reference; hi: the first unlike it found so far (len: none); the answer is
        # hi or a release in (lo, end) not run yet.
        lo, hi = 0, len(releases)
        end = hi
        while end - lo > 1:
            mid = (lo + end) // 2
            probe = next((i for i in range(mid, end) if not self._run(releases[i]).untestable), None)
            if probe is None:
                end = mid  # nothing in [mid, end) can be tested: look below it
            elif self.ran[releases[probe]].differs(reference):
                hi = end = probe
            else:
                lo = probe
        found = hi < len(releases)
        untested = [v for v in releases[lo + 1 : hi] if v in self.ran and self.ran[v].untestable]
        differing = {}
        if found:
            bad = self.ran[releases[hi]]
            differing["differing_cells"] = [
                DifferingCell(
                    cell=k, reference=reference.verdicts.get(k), release=releases[hi], verdict=bad.verdicts.get(k)
                )
                for k in bad.differs(reference)
            ]
        return ReleaseFound(
            releases=releases,
            reference=releases[0],
            runs=[self.ran[v].row() for v in releases if v in self.ran],
            release_runs=len(self.ran),
            budget=self.budget,
            first_bad=releases[hi] if found else None,
            last_good=releases[lo],
            untested_between=untested,
            **differing,
        )


def _describe(r: ReleaseRun) -> str:
    if r.untestable:
        return f"release {r.version}: cannot be tested ({r.untestable})"
    shown = ", ".join(f"{n} {v}" for v, n in sorted(_count(r.verdicts.values()).items()))
    return f"release {r.version}: {len(r.verdicts)} cells ({shown}) in {r.wall_s:.1f} s"


def run_release(
    version: str, *, args: Sequence[str], wheels: str | None, env: dict | None = None, timeout: float = 3600
) -> ReleaseRun:
    """``sglfix --release VERSION run ARGS --json F`` in a process of its own, which dies with this
    one (its workers die with it); its report in a folder the next search removes if this
    process dies before it does."""
    from sglfix.codebases.releases import die_with_parent, owned_tempdir, sweep_dead

    sweep_dead(tempfile.gettempdir(), prefix="sglfix-release-")
    with owned_tempdir(tempfile.gettempdir(), prefix="sglfix-release-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "sglfix", "--release", version]
        if wheels:
            cmd += ["--wheels", wheels]
        cmd += ["run", *args, "--json", str(out)]
        child = {**(env or os.environ), "COLUMNS": "200"}
        envs.SGLFIX_PROFILE.unset(env=child)
        t0 = time.perf_counter()
        try:
            r = subprocess.run(
                cmd, capture_output=True, text=True, env=child, timeout=timeout, preexec_fn=die_with_parent()
            )
        except subprocess.TimeoutExpired:
            return ReleaseRun(version, untestable=f"its run took more than {timeout:.0f} s", exit=124)
        wall = round(time.perf_counter() - t0, 1)
        if r.returncode not in (0, 1) or not out.is_file():
            lines = [line for line in (r.stderr or r.stdout).splitlines() if line.strip()]
            if r.returncode == 2:
                why = lines[-1].removeprefix("sglfix: error: ") if lines else "refused"
                return ReleaseRun(version, untestable=why, exit=2, wall_s=wall)
            raise ConfigError(
                f"release {version}: sglfix run failed (exit {r.returncode}): {lines[-1] if lines else 'no output'}"
            )
        report = json.loads(out.read_text())
    cells = report.get("cells") or []
    return ReleaseRun(
        version,
        verdicts={c["id"]: c["verdict"] for c in cells},
        reached={c["id"]: list(c.get("reached") or []) for c in cells},
        path=((report.get("codebase") or {}).get("path")) or "",
        exit=r.returncode,
        wall_s=wall,
    )


class Changed(NamedTuple):
    """A function as the last good and the first bad release have it."""

    old: str  # its source in the good release ('' where it had none)
    new: str  # its source in the bad release
    line: int  # its first line there
    file: str  # its module's file, relative to the release root


def changed_functions(good_root: Path, bad_root: Path, modules: Sequence[str]) -> dict[str, Changed]:
    """Functions of ``modules`` whose source differs between the two release roots (or that only
    the bad one has), by dotted name."""
    out: dict[str, Changed] = {}
    for module in dict.fromkeys(modules):
        rel = Path(*module.split("."))
        new_file = next((f for f in (bad_root / f"{rel}.py", bad_root / rel / "__init__.py") if f.is_file()), None)
        if new_file is None:
            continue
        old_file = good_root / new_file.relative_to(bad_root)
        new_text = new_file.read_text(encoding="utf-8", errors="replace")
        old_text = old_file.read_text(encoding="utf-8", errors="replace") if old_file.is_file() else ""
        if new_text == old_text:
            continue
        old = _functions(old_text, module)
        for name, (source, line) in _functions(new_text, module).items():
            before = old.get(name, ("", 0))[0]
            if before != source:
                out[name] = Changed(before, source, line, str(new_file.relative_to(bad_root)))
    return out


def _functions(text: str, module: str) -> dict[str, tuple[str, int]]:
    """Every function and method of a module's source (nested classes too), by dotted name."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    lines = text.splitlines(keepends=True)
    found: dict[str, tuple[str, int]] = {}

    def walk(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}.{node.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                found[f"{prefix}.{node.name}"] = ("".join(lines[first - 1 : node.end_lineno]), first)

    walk(tree.body, module)
    return found


def reached_diff(
    good: ReleaseRun, bad: ReleaseRun, changed: dict[str, Changed], reached: Sequence[str]
) -> list[ChangedFunction]:
    """The changed functions the differing cells reached: each with its file and line in the first
    bad release and the unified diff from the last good one."""
    out: list[ChangedFunction] = []
    for name in sorted(set(reached) & set(changed)):
        c = changed[name]
        diff = "".join(
            difflib.unified_diff(
                c.old.splitlines(keepends=True),
                c.new.splitlines(keepends=True),
                fromfile=f"{good.version}/{c.file}",
                tofile=f"{bad.version}/{c.file}",
            )
        )
        out.append(ChangedFunction(function=name, file=c.file, line=c.line, diff=diff))
    return out
