"""``sglfix doctor``: every toggle and part applies and restores cleanly against the code now."""

from __future__ import annotations

from pathlib import Path

import typer

from sglfix.cli.context import emit_json, options, out


def doctor_cmd(
    ctx: typer.Context,
    source: str | None = typer.Option(
        None, "--source", metavar="DIR", help="Check against source files under DIR without importing them."
    ),
    toggles: str | None = typer.Option(None, "--toggles", metavar="DIR", help="Toggle files directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    caught_by: bool = typer.Option(
        False,
        "--caught-by",
        help="Also run each toggle's caught_by tests with the toggle reverted (pytest, from --tests-root): each must fail.",
    ),
    tests_root: str = typer.Option(
        ".", "--tests-root", metavar="DIR", help="Directory the caught_by test paths are relative to."
    ),
    scenario_file: list[str] = typer.Option(
        [],
        "--scenario-file",
        metavar="PATH",
        help="Check the expectations against these scenario files (as matrix --scenario-file runs them) instead of the built-in scenarios.",
    ),
) -> None:
    """Check that every toggle and part applies and restores cleanly against the code now."""
    import sys

    from sglfix.common.errors import ConfigError
    from sglfix.toggling.doctor import (
        PYTEST_HINT,
        caught_by_check,
        expectation_check,
        pytest_missing,
    )

    opts = options(ctx)
    for option, value in (("--source", source), ("--toggles", toggles), ("--tests-root", tests_root)):
        if value is not None and not value.strip():
            raise ConfigError(f"{option} '': the path is empty; give a directory")
    registry = opts.registry(toggles)
    # What --caught-by needs is refused before the other checks, not after them.
    if caught_by:
        if not Path(tests_root).is_dir():
            raise ConfigError(
                f"--tests-root {tests_root} is not a directory; give the project root the caught_by paths start from"
            )
        why = pytest_missing() if any(t.caught_by for t in registry) else None
        if why is not None:
            raise ConfigError(
                f"--caught-by runs each toggle's caught_by tests with pytest, which {sys.executable} cannot "
                f"import ({why}); install it: {PYTEST_HINT}"
            )
    registry, results, mode = _apply_checks(opts, registry, source=source, toggles=toggles)
    # Every expectation, the profile's or a --toggles directory's, against the scenarios a matrix
    # would run with the same options: the built-in ones, or only the given files.
    from sglfix.scenario import load_scenarios

    profile = opts.active_profile()
    names = [
        sc.name
        for sc in load_scenarios(list(scenario_file), builtin=not scenario_file, builtin_dir=profile.scenarios_dir)
    ]
    expectations = expectation_check(registry, names)
    results += expectations
    checked = sum(len(t.expect) for t in registry)
    against = (
        f"{len(scenario_file)} scenario file(s)"
        if scenario_file
        else f"the {len(names)} built-in scenarios of profile {profile.name}"
    )
    if caught_by:
        results += caught_by_check(registry, root=tests_root)
    failed = [r for r in results if not r.ok]
    if as_json:
        emit_json(
            {
                "mode": mode,
                "source": source,
                "directory": registry.directory,
                "ok": not failed,
                "toggles": [r.to_json() for r in results],
                "expectations_checked": checked,
                "expectations_against": against,
            }
        )
    else:
        if not results:
            out.print(f"no toggles registered in {registry.directory}: nothing to check")
        for r in results:
            out.print("ok     " if r.ok else "DRIFTED", style="green" if r.ok else "red", end="")
            out.print(
                f" {r.id}"
                + (f"  ({', '.join(r.targets)})" if r.targets else "")
                + (f"  [{r.absent}]" if r.absent else "")
            )
            if not r.ok:
                out.print(r.error)
        out.print(
            f"{len(results) - len(failed)}/{len(results)} checks pass ({mode}: each toggle and part "
            "applies and restores cleanly; "
            + (
                f"each of {checked} expectation(s) checked against {against}"
                if checked
                else "no toggle has expectations"
            )
            + ("; each caught_by test fails with its toggle reverted)" if caught_by else ")")
        )
    if failed:
        raise typer.Exit(1)


def _apply_checks(opts, registry, *, source: str | None, toggles: str | None) -> tuple:
    """Every part against the source tree (static, without importing it) or the installed code
    (live; then also the profile's own candidate fixes, as run --apply applies them)."""
    from sglfix.toggling.doctor import live_check, static_check

    if source is not None:
        profile = opts.active_profile()
        if not profile.is_reproduction and toggles is None:
            from sglfix.codebases.installed import version_of_tree
            from sglfix.toggling.registry import load_registry

            # Each part as it is in the tree's version (its variant there), not the installed one's.
            version = version_of_tree(source, profile)
            if version and version != "unknown":
                registry = load_registry(registry.directory, version=version)
        return registry, static_check(registry, source_dir=source), "static"
    opts.enter_codebase()  # the live check imports the profile's code base
    results = live_check(registry, allowed_prefixes=opts.allowed_prefixes())
    if toggles is None:
        from sglfix.execution.known import fix_check

        results += fix_check(opts.active_profile())
    return registry, results, "live"


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
