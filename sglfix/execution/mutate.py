"""A mutation campaign (``sglfix mutate``): which lines of the code base's attention-metadata code
could break without any selected scenario noticing.

Three steps, each through the one runner (workers, ``--devices``, Ray, the result store):
1. the selected scenarios' baselines run once, recording every function of the code base each
   one enters and digesting what it built (``sglfix.harness.fingerprint``);
2. the functions entered, narrowed to the profile's metadata surface (or ``--function``), are
   mutated (``sglfix.mutation.operators``); each mutant is a diff in the code base's own paths,
   loaded as a candidate fix exactly as ``--apply`` loads one;
3. each mutant runs over the cells whose baseline entered its function, compared cell by cell
   with those baselines by the one judgement (``sglfix.report.outcome``). First over a few cells
   per mutant (the cheapest, of different modes and graph settings), then the survivors over
   every reaching cell: a mutant stops costing once one cell shows it. ``--all-cells`` runs
   every reaching cell of every mutant.

With candidate fixes (``--apply``) every cell, baselines included, runs atop them: a mutant is
then judged against the code as the fixes make it, so that a path a live bug's known divergence
masks (any output there already fails) can show a mutant. A mutant of a line a fix rewrites is
not run (its diff is of code the fixes replace); the report says which.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglfix.common.errors import ConfigError
from sglfix.execution.settings import EVERY_FUNCTION
from sglfix.execution.store.folder import MUTANT_MEMO

if TYPE_CHECKING:
    from sglfix.report.mutation import Selection

__all__ = ["Campaign", "check_function_patterns", "run_campaign", "surface_of"]

# Verdicts of a baseline that records nothing usable: its scenario's cells cannot say anything.
_UNUSABLE = ("ERROR", "SKIP", "TIMEOUT", "FAULT")


@dataclass
class Campaign:
    """What a campaign ran and found, for the report (``sglfix.report.mutation``)."""

    mutants: list[Any]  # sglfix.mutation.model.Mutant, in generation order
    baselines: list[Any]  # CellResult of each selected scenario's baseline
    cells: list[Any]  # CellResult of every mutant cell that ran (or was served)
    reached: dict[str, list[str]]  # function -> scenarios whose baseline entered it
    functions: list[str]  # the functions mutated
    scenarios: list[Any]  # the selected scenarios
    unusable: dict[str, str] = field(default_factory=dict)  # scenario -> why its baseline cannot judge
    load_errors: dict[str, str] = field(default_factory=dict)  # mutant id -> why it could not be loaded
    phases: list[dict] = field(default_factory=list)  # per step: what ran, what the store served, wall
    info: dict = field(default_factory=dict)  # the workers' facts (device, code base)
    wall: float = 0.0
    reaching: dict[str, int] = field(default_factory=dict)  # mutant id -> selected cells that reach it
    shard: str | None = None  # "i/N": this campaign ran that share of the mutants
    # Surface functions no baseline entered, in the files of those some baseline did enter; how
    # many surface functions sit in files no baseline entered.
    unreached_functions: list[str] = field(default_factory=list)
    elsewhere: int = 0
    elsewhere_files: int = 0
    # The candidate fixes every cell ran atop (ids), and the mutants not run because a fix
    # rewrites their line (mutant id -> why).
    base: tuple[str, ...] = ()
    replaced: dict[str, str] = field(default_factory=dict)


def check_function_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    for p in patterns:
        if not p.strip():
            raise ConfigError(
                "--function: empty pattern; give a function name or glob (e.g. '*init_forward_metadata*')"
            )
    return tuple(patterns)


def surface_of(names: Sequence[str], *, codebase: Any, patterns: Sequence[str] = ()) -> list[str]:
    """The functions of ``names`` a campaign mutates: those ``--function`` patterns match (a
    pattern without a dot or a ``*`` matches the function's last name), else those the profile's
    metadata surface declares, less what it excludes."""
    out = []
    for name in names:
        if patterns:
            if any(matches_function(name, p) for p in patterns):
                out.append(name)
        elif any(fnmatch.fnmatchcase(name, g) for g in codebase.mutate_surface) and not any(
            fnmatch.fnmatchcase(name, g) for g in codebase.mutate_exclude
        ):
            out.append(name)
    return out


def matches_function(name: str, pattern: str) -> bool:
    """Whether the dotted function ``name`` is one a ``--function`` pattern names: a bare name its
    last part, else a glob over the whole name or its dotted tail."""
    if "*" not in pattern and "?" not in pattern and "." not in pattern:
        return name.rsplit(".", 1)[-1] == pattern
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*." + pattern)


@dataclass(frozen=True)
class Choice:
    """What a campaign mutates and how far it runs each mutant."""

    functions: tuple[str, ...] = ()  # --function patterns (empty: the profile's surface)
    operators: tuple[str, ...] | None = None  # None: every operator
    first_cells: int = 3  # cells each mutant tries first
    # Further cells a mutant no first cell showed is tried on (of different paths again). A
    # mutant is called survived (or equivalent) over the cells it ran; the report says how many
    # of the cells that reach it those were.
    more_cells: int = 9
    all_cells: bool = False  # every reaching cell of every mutant
    # A mutant that its sampled cells did not show but that built something different there (a
    # survivor so far) tries every other cell that reaches it: a survivor is then one no scenario
    # shows, not one the sample missed. The suspected equivalents keep to the sample.
    survivors_every_cell: bool = False
    # These mutants instead of the operators' (each of a function the scenarios run: a test
    # plants one).
    given: tuple[Any, ...] | None = None


def run_campaign(
    settings: Any,
    target: Any,
    *,
    choice: Choice,
    progress: Callable[[Any], Any],
    say: Callable[[str], None] = lambda line: None,
) -> Campaign:
    """The campaign of ``settings``' scenarios over ``target``'s code base (see the module's
    docstring). ``say`` hears one line per step."""
    from sglfix.execution.planner import plan_run
    from sglfix.execution.runner import Runner

    start = time.perf_counter()
    # A shard of a campaign is a share of its mutants (every shard runs every baseline: each
    # mutant needs its cells' baselines), so that shards' reports merge mutant by mutant.
    shard = None
    if settings.shard is not None:
        from sglfix.execution.shards import parse_shard

        if settings.shard_costs is not None:
            raise ConfigError("--shard-costs balances shards of cells: mutate shares mutants out; leave it out")
        shard = parse_shard(settings.shard)
        settings = settings.model_copy(update={"shard": None})
    base = tuple(c.id for c in target.candidates)
    base_settings = settings.model_copy(update={"record": (EVERY_FUNCTION,), "fingerprint": True})
    runner = Runner(base_settings, target, what="mutate")
    with runner.booting():
        plan = runner.plan(
            lambda chosen, *, registry, env_ids: plan_run(chosen, revert=base, env_ids=env_ids, registry=registry)
        )
        ran = runner.run(plan, progress=progress)
    campaign = Campaign(
        mutants=[],
        baselines=list(ran.results),
        cells=[],
        reached={},
        functions=[],
        scenarios=list(plan.scenarios),
        info=dict(ran.info),
        base=base,
    )
    campaign.phases.append(_phase("baselines", ran))
    for r in ran.results:
        if r.verdict in _UNUSABLE or r.reached is None:
            campaign.unusable[r.scenario] = r.key_figure or r.verdict
            continue
        for name in r.reached:
            campaign.reached.setdefault(name, []).append(r.scenario)
    say(
        f"{len(ran.results)} baseline(s) ran; {len(campaign.reached)} function(s) of the code base entered"
        + (f"; {len(campaign.unusable)} baseline(s) cannot judge a mutant" if campaign.unusable else "")
    )
    codebase = target.codebase
    functions, given = choice.functions, choice.given
    chosen = surface_of(sorted(campaign.reached), codebase=codebase, patterns=functions)
    if functions and not chosen and given is None:
        from sglfix.common.schema import nearest

        raise ConfigError(
            f"--function {functions[0]}: matches none of the {len(campaign.reached)} function(s) the selected "
            f"scenarios run{nearest(functions[0], [n.rsplit('.', 1)[-1] for n in campaign.reached])}; "
            "give a function the scenarios run (sglfix mutate --list-functions shows them)"
        )
    campaign.functions = chosen
    if given is not None:
        campaign.mutants = list(given)
        campaign.functions = sorted({m.function for m in given})
    else:
        campaign.mutants = _generate(chosen, codebase=codebase, operators=choice.operators)
        unreached, campaign.elsewhere, campaign.elsewhere_files = _unreached(
            chosen, reached=list(campaign.reached), codebase=codebase, functions=functions
        )
        campaign.unreached_functions = unreached
        campaign.mutants += _generate(unreached, codebase=codebase, operators=choice.operators)
    if shard is not None:
        campaign.mutants = [m for m in campaign.mutants if _share(m.id, shard.count) == shard.index - 1]
        campaign.shard = str(shard)
    say(
        f"{len(campaign.mutants)} mutant(s) of {len(chosen)} function(s) the selected cells run"
        + (
            f" and {len(campaign.unreached_functions)} beside them that none runs"
            if campaign.unreached_functions
            else ""
        )
    )
    if not campaign.mutants:
        campaign.wall = time.perf_counter() - start
        return campaign
    # Only a mutant some cell will run is loaded (a diff checked against the source is the costly
    # step); the others are listed as they are, not reached.
    runnable = [m for m in campaign.mutants if campaign.reached.get(m.function)]
    candidates, campaign.load_errors = load_mutants(runnable, codebase=codebase, memo_dir=runner.store_dir)
    if base:
        from sglfix.mutation.atop import replaced_by

        campaign.replaced = replaced_by(target.candidates, candidates, codebase=codebase)
        candidates = [c for c in candidates if c.id.removeprefix("+") not in campaign.replaced]
        campaign.mutants = [m for m in campaign.mutants if m.id not in campaign.replaced]
    by_id = {c.id: c for c in candidates}
    scenario_of = {s.name: s for s in plan.scenarios}
    baseline_of = {r.scenario: r for r in ran.results}
    reaching = {
        m.id: [scenario_of[n] for n in campaign.reached.get(m.function, []) if n in scenario_of]
        for m in campaign.mutants
        if "+" + m.id in by_id
    }
    all_cells = choice.all_cells
    from sglfix.report.mutation import family_of

    family = {m.id: family_of(m.path) for m in campaign.mutants}
    first = {
        mid: (cells if all_cells else _sample(cells, baseline_of, choice.first_cells, family=family[mid]))
        for mid, cells in reaching.items()
    }
    mutant_target = _with_candidates(target, candidates)
    run_settings = settings.model_copy(update={"record": (), "fingerprint": True, "reachability": False})
    mrunner = Runner(run_settings, mutant_target, what="mutate")
    results = _run_round(mrunner, first, progress=progress, campaign=campaign, name="mutants")
    if not all_cells:
        results += _later_rounds(
            results,
            choice=choice,
            reaching=reaching,
            first=first,
            baseline_of=baseline_of,
            family=family,
            run=lambda cells, name: _run_round(mrunner, cells, progress=progress, campaign=campaign, name=name),
            say=say,
        )
    campaign.reaching = {mid: len(cells) for mid, cells in reaching.items()}
    campaign.cells = results
    campaign.wall = time.perf_counter() - start
    return campaign


def mutants_of(toggles: Sequence[str]) -> list[str]:
    """The mutant ids of a mutant cell's toggles: its last (a campaign's candidate fixes, which
    every cell runs atop, come first)."""
    return [toggles[-1].removeprefix("+")] if toggles else []


def _unreached(chosen: Sequence[str], *, reached: Sequence[str], codebase: Any, functions: Sequence[str]) -> tuple:
    """The surface functions no selected cell entered, in the files of those it did enter (their
    mutants are listed not reached: the work list of scenarios to write), and how many surface
    functions sit in files no selected cell entered at all (their backends have no scenario here)."""
    files = {_module_of(n) for n in chosen}
    declared = _declared(codebase, functions)
    unreached = sorted(n for n in declared if n not in set(reached) and _module_of(n) in files)
    elsewhere = [n for n in declared if _module_of(n) not in files]
    return unreached, len(elsewhere), len({_module_of(n) for n in elsewhere})


def _module_of(name: str) -> str:
    """The module part of a dotted function name (class and method names start upper / lower;
    a module path is everything before the first capitalised part or the last part)."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p[:1].isupper():
            return ".".join(parts[:i])
    return ".".join(parts[:-1])


def _share(mid: str, count: int) -> int:
    """The shard (0-based) a mutant falls to: from its id, the same on every machine."""
    import hashlib

    return int(hashlib.sha1(mid.encode()).hexdigest()[:8], 16) % count


def _phase(name: str, ran: Any) -> dict:
    store = ran.store or {}
    return {
        "name": name,
        "cells": len(ran.results),
        "served": store.get("served", 0),
        "ran": store.get("ran", len(ran.results)),
        "wall_s": round(ran.wall, 2),
    }


def _sample(cells: list[Any], baseline_of: dict[str, Any], n: int, *, family: str | None = None) -> list[Any]:
    """Up to ``n`` of ``cells`` to try a mutant on first: the cheapest baseline of each (mode,
    graph or not, page size) in turn, so that a few cells cover different paths; cells whose
    baseline passes before those whose baseline already fails (a known divergence shows a mutant
    only where the mutant changes that failure). A mutant of one backend's file (``family``) is
    tried on that backend's scenarios first: others that merely construct the backend, or run
    it as a sub-backend, judge less of what its metadata feeds."""
    if n <= 0 or len(cells) <= n:
        return list(cells)
    if family is not None:
        own = [s for s in cells if getattr(s, "backend", None) == family]
        if own and len(own) < len(cells):
            picked = _sample(own, baseline_of, n)
            if len(picked) >= n:
                return picked
            return picked + _sample([s for s in cells if s not in picked], baseline_of, n - len(picked))

    def cost(s: Any) -> float:
        t = (baseline_of[s.name].timings_ms or {}) if s.name in baseline_of else {}
        return float(t.get("total") or t.get("run") or 1e9)

    def failing(s: Any) -> bool:
        return getattr(baseline_of.get(s.name), "verdict", "PASS") != "PASS"

    groups: dict[tuple, list[Any]] = {}
    for s in sorted(cells, key=lambda s: (failing(s), cost(s), s.name)):
        groups.setdefault((s.mode, s.capture_bs is not None, s.page_size), []).append(s)
    out: list[Any] = []
    lines = list(groups.values())
    while len(out) < n and any(lines):
        for line in lines:
            if line and len(out) < n:
                out.append(line.pop(0))
    return out


def _moved(results: list[Any], baseline_of: dict[str, Any]) -> set[str]:
    """The mutants (ids) some cell of ``results`` showed: a verdict other than its baseline's, or
    its baseline's failure another way (``fails_otherwise``: other rows, another check), a failure
    of sglfix or the machine aside (ERROR, TIMEOUT say nothing of the mutant)."""
    from sglfix.report.outcome import effective, fails_otherwise

    out: set[str] = set()
    for r in results:
        base = baseline_of.get(r.scenario)
        cell = r.to_json()
        v = effective(cell)
        if base is None or v in ("ERROR", "TIMEOUT", "SKIP"):
            continue
        if v == base.verdict and fails_otherwise(cell, base.to_json()) is None:
            continue
        out.update(mutants_of(r.toggles))
    return out


def _later_rounds(
    results: list[Any],
    *,
    choice: Choice,
    reaching: dict[str, list[Any]],
    first: dict[str, list[Any]],
    baseline_of: dict[str, Any],
    family: dict[str, str],
    run: Callable[[dict[str, list[Any]], str], list[Any]],
    say: Callable[[str], None],
) -> list[Any]:
    """The cells after the first round: a few more for the mutants their first cells did not
    show, then (``survivors_every_cell``) every other reaching cell for the survivors so far."""
    more: list[Any] = []
    moved = _moved(results, baseline_of)
    if choice.more_cells:
        rest = {}
        for mid, cells in reaching.items():
            left = [s for s in cells if s not in first[mid]]
            if mid not in moved and left:
                rest[mid] = _sample(left, baseline_of, choice.more_cells, family=family[mid])
        if rest:
            say(
                f"{len(moved)} mutant(s) shown by their first cells; {len(rest)} tried on up to "
                f"{choice.more_cells} more of the cells that reach them"
            )
            more += run(rest, "survivors")
            moved = _moved(results + more, baseline_of)
    if choice.survivors_every_cell:
        last = _untried_of_survivors(results + more, reaching=reaching, moved=moved, baseline_of=baseline_of)
        if last:
            say(
                f"{len(last)} survivor(s) so far tried on every other cell that reaches them "
                f"({sum(map(len, last.values()))} cells)"
            )
            more += run(last, "every cell")
    return more


def _untried_of_survivors(
    results: list[Any], *, reaching: dict[str, list[Any]], moved: set[str], baseline_of: dict[str, Any]
) -> dict[str, list[Any]]:
    """Each survivor so far (not moved, built something different) -> the reaching cells it has
    not run yet."""
    tried: dict[str, set[str]] = {}
    for r in results:
        for mid in mutants_of(r.toggles):
            tried.setdefault(mid, set()).add(r.scenario)
    different = _built_different(results, baseline_of)
    last = {
        mid: [s for s in cells if s.name not in tried.get(mid, ())]
        for mid, cells in reaching.items()
        if mid not in moved and mid in different
    }
    return {mid: cells for mid, cells in last.items() if cells}


def _built_different(results: list[Any], baseline_of: dict[str, Any]) -> set[str]:
    """The mutants (ids) that ``sglfix.report.mutation.classify`` could not call suspected
    equivalents from ``results``: some cell did not build what its baseline built
    (``built_same``)."""
    from sglfix.report.mutation import built_same

    out: set[str] = set()
    for r in results:
        base = baseline_of.get(r.scenario)
        if base is not None and not built_same(r.to_json(), base.to_json()):
            out.update(mutants_of(r.toggles))
    return out


def _run_round(runner: Any, cells: dict[str, list[Any]], *, progress: Any, campaign: Campaign, name: str) -> list:
    """One plan of mutant cells, mutant by mutant (a worker switches mutants as rarely as it can)."""
    from sglfix.execution.planner import Plan, PlannedCell

    planned = [PlannedCell(s, (*campaign.base, "+" + mid)) for mid, scenarios in cells.items() for s in scenarios]
    if not planned:
        return []
    scenarios = list({c.scenario.name: c.scenario for c in planned}.values())
    sets = list(dict.fromkeys(c.toggles for c in planned))

    def build(chosen: Any, *, registry: Any, env_ids: Any) -> Plan:
        return Plan(scenarios=scenarios, sets=sets, env_ids=tuple(env_ids), cells=planned)

    plan = runner.plan(build, chosen=scenarios)
    ran = runner.run(plan, progress=progress)
    campaign.phases.append(_phase(name, ran))
    return list(ran.results)


def _generate(functions: Sequence[str], *, codebase: Any, operators: Any) -> list[Any]:
    """The mutants of each function, from its file in the installed code base (found as the
    catalogue and ``doctor --source`` find a toggle's target)."""
    from sglfix.common.codebase import package_dir
    from sglfix.common.errors import SglfixError
    from sglfix.mutation.catalogue import locate_function
    from sglfix.mutation.operators import mutants_of_function

    root = package_dir(codebase.package)
    if root is None:
        raise ConfigError(f"{codebase.package} is not installed here; mutate changes its installed source")
    out: list[Any] = []
    texts: dict[Path, str] = {}
    for name in functions:
        try:
            path, qualname, _source, _first = locate_function(name, codebase.package, Path(root))
        except SglfixError:
            continue  # not a function of a file of the package (defined at run time): nothing to change
        if path not in texts:
            texts[path] = path.read_text(encoding="utf-8")
        out += mutants_of_function(
            texts[path],
            qualname=qualname,
            function=name,
            path=codebase.repo_prefix + path.relative_to(root).as_posix(),
            operators=operators,
        )
    unique = {m.id: m for m in out}
    return list(unique.values())


def load_mutants(
    mutants: Sequence[Any], *, codebase: Any, memo_dir: str | None = None
) -> tuple[list[Any], dict[str, str]]:
    """Each mutant's diff loaded as a candidate fix (``--apply``'s loader, so that what runs is
    what ``mutate --show`` prints and ``--apply`` replays); one that cannot be loaded is an
    error of sglfix's operators, said per mutant, never dropped silently. With a result store
    (``memo_dir``), a mutant mapped by an earlier campaign onto the same file with the same
    loader is taken from its memo (``_Mapped``): mapping is most of a served campaign's own work."""
    from sglfix.toggling.candidate import load_candidate

    memo = _Mapped(memo_dir, codebase) if memo_dir else None
    out, errors = [], {}
    with tempfile.TemporaryDirectory(prefix="sglfix-mutants-") as folder:
        for m in mutants:
            path = os.path.join(folder, f"{m.id}.patch")
            known = memo.get(m, path) if memo else None
            if known is not None:
                out.append(known)
                continue
            Path(path).write_text(m.diff, encoding="utf-8")
            try:
                cand = load_candidate(path, codebase=codebase)
            except ConfigError as exc:
                errors[m.id] = str(exc).replace(path, f"{m.id}.patch")
                continue
            out.append(cand)
            if memo:
                memo.put(m, cand)
    if memo:
        memo.save()
    return out, errors


class _Mapped:
    """Mutants mapped onto the installed source by an earlier campaign, in the result store's
    folder: keyed by the diff, the file it changes as it is now, the code base and sglfix's
    loader (the ``toggling`` and ``patching`` packages' sources), so that an entry is only ever
    what loading the diff again would give. Written whole and atomically; a file that cannot be
    read is an empty memo."""

    _FILE = MUTANT_MEMO

    def __init__(self, folder: str, codebase: Any) -> None:
        import hashlib
        import json

        from sglfix.common.codebase import package_dir

        self.path = Path(folder) / self._FILE
        self.codebase = codebase
        self.root = package_dir(codebase.package)
        self.files: dict[str, str | None] = {}
        loader = hashlib.sha256(codebase.package.encode())
        here = Path(__file__).resolve().parent.parent
        for sub in ("toggling", "patching"):
            for f in sorted((here / sub).glob("*.py")):
                loader.update(f.name.encode() + f.read_bytes())
        self.loader = loader.hexdigest()
        try:
            held = json.loads(self.path.read_text(encoding="utf-8"))
            self.entries = held["entries"] if held.get("loader") == self.loader else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.entries = {}
        self.changed = False

    def _key(self, m: Any) -> str | None:
        import hashlib

        rel = m.path[len(self.codebase.repo_prefix) :] if m.path.startswith(self.codebase.repo_prefix) else m.path
        if rel not in self.files:
            try:
                self.files[rel] = (
                    None if self.root is None else hashlib.sha256((Path(self.root) / rel).read_bytes()).hexdigest()
                )
            except (OSError, TypeError):
                self.files[rel] = None
        if self.files[rel] is None:
            return None
        return hashlib.sha256(f"{m.path}\0{self.files[rel]}\0{m.diff}".encode()).hexdigest()

    def get(self, m: Any, path: str) -> Any:
        import hashlib

        from sglfix.toggling.candidate import Candidate
        from sglfix.toggling.registry import Part, PartFile

        key = self._key(m)
        entry = self.entries.get(key) if key else None
        if entry is None:
            return None
        try:
            patches = PartFile(summary=entry["title"] or "-", patches=entry["patches"]).patches
            cid = "+" + m.id
            return Candidate(
                id=cid,
                path=path,
                sha256=hashlib.sha256(m.diff.encode()).hexdigest(),
                title=entry["title"],
                url=entry["url"],
                package=self.codebase.package,
                part=Part(name=cid, summary=entry["title"], patches=patches),
                notes=tuple(entry["notes"]),
                text=m.diff,
            )
        except Exception:  # a damaged entry: the diff is loaded again
            return None

    def put(self, m: Any, cand: Any) -> None:
        key = self._key(m)
        if key is None or cand.text != m.diff or cand.id != "+" + m.id:
            return
        self.entries[key] = {
            "title": cand.title,
            "url": cand.url,
            "notes": list(cand.notes),
            "patches": [p.model_dump(mode="json") for p in cand.part.patches],
        }
        self.changed = True

    def save(self) -> None:
        import json

        if not self.changed:
            return
        from sglfix.common.atomic import write_atomic

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Not synced: the memo is checked at each read, so one a crash cut short is a miss.
            write_atomic(self.path, json.dumps({"loader": self.loader, "entries": self.entries}), fsync=False)
        except OSError:
            pass


def _with_candidates(target: Any, candidates: Sequence[Any]) -> Any:
    import dataclasses

    # The target's own candidates (the fixes every cell runs atop) stay: the workers load them too.
    return dataclasses.replace(
        target,
        registry=target.registry.with_candidates(candidates),
        candidates=(*target.candidates, *candidates),
    )


def _declared(codebase: Any, patterns: Sequence[str]) -> list[str]:
    """Every function of the installed code base on the surface (or matching ``patterns``), by
    reading its files (nothing imported): what no selected scenario entered is listed."""
    import ast

    from sglfix.common.codebase import package_dir

    root = package_dir(codebase.package)
    if root is None:
        return []
    names: list[str] = []
    globs = list(patterns) or list(codebase.mutate_surface)
    for folder, _dirs, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, f), root)
            parts = rel[:-3].split(os.sep)
            # A package's functions live in its __init__.py: the module is the package itself.
            module = ".".join([codebase.package, *(parts[:-1] if parts[-1] == "__init__" else parts)])
            if not any(_could_hold(module, g) for g in globs):
                continue
            try:
                tree = ast.parse(Path(folder, f).read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.append(f"{module}.{node.name}")
                elif isinstance(node, ast.ClassDef):
                    names += [
                        f"{module}.{node.name}.{m.name}"
                        for m in node.body
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                    ]
    return surface_of(names, codebase=codebase, patterns=patterns)


def _could_hold(module: str, glob: str) -> bool:
    """Whether a function of ``module`` could match ``glob`` (a cheap filter before parsing): its
    names are ``module.f`` and ``module.Class.f``, so a full dotted pattern's fixed head and
    ``module.`` must be one a prefix of the other; a pattern that is not rooted at the package
    matches as a name's tail (``_matches``), which any module could hold."""
    head = glob.split("*", 1)[0].split("?", 1)[0]
    if "." not in head:
        return True
    here = module + "."
    if here.startswith(head) or head.startswith(here):
        return True
    return not head.startswith(module.split(".", 1)[0] + ".")


def mutants_on_surface(*, codebase: Any, functions: Sequence[str] = (), operators: Any = None) -> list[Any]:
    """Every mutant of the installed code base's surface (or of the ``functions`` patterns), made
    from its files alone, no cell run: what ``mutate --show ID`` looks an id up in."""
    return _generate(_declared(codebase, functions), codebase=codebase, operators=operators)


def catalogue_rows(target: Any, *, operators: Any = None) -> list[dict]:
    """The toggles' reverts as a check of the operators (``sglfix.mutation.catalogue``): each
    part's change of each function against the mutants generated for it."""
    from sglfix.common.codebase import package_dir
    from sglfix.mutation.catalogue import check_catalogue

    cb = target.codebase
    root = package_dir(cb.package)
    if root is None:
        return []
    rows = check_catalogue(
        registry=target.registry,
        package=cb.package,
        source_root=Path(root),
        repo_prefix=cb.repo_prefix,
        operators=operators,
    )
    return [r.model_dump() for r in rows]


def campaign_report(
    campaign: Campaign,
    *,
    command: Any,
    profile: Any,
    selection: Selection,
    catalogue: Sequence[dict] = (),
    applied: Sequence[Any] = (),
    marks: Mapping[str, Any] | None = None,
    marks_file: str | None = None,
) -> dict:
    """The mutation report of ``campaign`` (``sglfix.report.mutation``): its cells judged against
    their baselines by the one judgement, each mutant's status, hint and the scores. ``applied``:
    the candidate fixes every cell ran atop (``sglfix.toggling.candidate.Candidate``); ``marks``:
    the profile's reviewed equivalents that hold atop them (``sglfix.mutation.reviewed``), read
    from ``marks_file`` (as the report names it)."""
    from sglfix.report.mutation import (
        Classified,
        ScenarioRun,
        Status,
        apply_marks,
        build_mutation_report,
        classify_report,
    )

    cells = [r.to_json() for r in campaign.baselines] + [r.to_json() for r in campaign.cells]
    for c in cells:
        for key in ("reached", "reached_at", "deps"):
            c.pop(key, None)
        # Every cell ran atop the candidate fixes: judged as a campaign on the fixed code, where a
        # baseline is a cell with no mutant.
        c["toggles"] = [t for t in c.get("toggles") or () if t not in campaign.base]
    loaded = [m for m in campaign.mutants if m.id not in campaign.load_errors]
    classified = classify_report(report={"cells": cells, "device": campaign.info.get("device")}, mutants=loaded)
    hints = {}
    for mid, why in campaign.load_errors.items():
        classified[mid] = Classified(status=Status.ERROR)
        hints[mid] = f"sglfix could not load the mutant's diff (a fault of its operator): {why}"
    reviews = None
    if marks_file is not None:
        reviews = {
            "file": marks_file,
            **apply_marks(classified, mutants=loaded, marks=marks or {}, functions=campaign.functions),
        }
    runs = [
        ScenarioRun(name=s.name, backend=s.backend, mode=str(s.mode), cuda_graph=s.capture_bs is not None)
        for s in campaign.scenarios
    ]
    phases = {p["name"]: p for p in campaign.phases}
    base = phases.get("baselines", {})
    rounds = [p for p in campaign.phases if p["name"] != "baselines"]
    notes = [
        f"baseline of {n} cannot judge a mutant ({why}): its cells were not run" for n, why in campaign.unusable.items()
    ]
    if campaign.replaced:
        shown = ", ".join(f"{mid} ({why})" for mid, why in sorted(campaign.replaced.items())[:5])
        more = len(campaign.replaced) - 5
        notes.append(
            f"{len(campaign.replaced)} mutant(s) of lines the candidate fixes rewrite were not run: {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    if campaign.elsewhere:
        notes.append(
            f"{campaign.elsewhere} function(s) of the metadata surface in {campaign.elsewhere_files} file(s) that no "
            "selected scenario enters were not mutated (their backends have no selected scenario)"
        )
    info = campaign.info
    facts = {
        "command": command,
        "wall_s": campaign.wall,
        "codebase": info.get("codebase"),
        "device": info.get("device"),
        "device_name": info.get("device_name"),
        "profile": getattr(profile, "name", None),
        "selection": selection,
        "phases": {
            "baseline_s": base.get("wall_s"),
            "mutants_s": round(sum(p["wall_s"] for p in rounds), 2),
            "baseline_cells": base.get("cells", 0),
            "mutant_cells": sum(p["cells"] for p in rounds),
            "ran": sum(p["ran"] for p in rounds),
            "served": sum(p["served"] for p in rounds),
        },
        "notes": notes,
        "catalogue": list(catalogue),
        "applied": [{"id": c.id, "title": c.title, "sha256": c.sha256} for c in applied],
        "reviews": reviews,
    }
    if campaign.shard is not None:
        facts["shard"] = campaign.shard
    return build_mutation_report(
        facts=facts,
        mutants=campaign.mutants,
        classified=classified,
        scenarios=runs,
        hints=hints,
        reaching={m.id: campaign.reaching.get(m.id, 0) for m in campaign.mutants},
    )
