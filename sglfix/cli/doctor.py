"""``sglfix doctor``: every toggle and part applies and restores cleanly against the code now."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sglfix.cli.context import emit_json, options, out


def _is_profile_registry(registry, profile) -> bool:
    return Path(registry.directory).resolve() == Path(profile.toggles_dir).resolve()


def doctor_cmd(
    ctx: typer.Context,
    source: Optional[str] = typer.Option(None, "--source", metavar="DIR", help="Check against source files under DIR without importing them."),
    toggles: Optional[str] = typer.Option(None, "--toggles", metavar="DIR", help="Toggle files directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    caught_by: bool = typer.Option(False, "--caught-by", help="Also run each toggle's caught_by tests with the toggle reverted (pytest, from --tests-root): each must fail."),
    tests_root: str = typer.Option(".", "--tests-root", metavar="DIR", help="Directory the caught_by test paths are relative to."),
) -> None:
    """Check that every toggle and part applies and restores cleanly against the code now."""
    from sglfix.toggling.doctor import caught_by_check, expectation_check, live_check, static_check

    opts = options(ctx)
    registry = opts.registry(toggles)
    if source is not None:
        results = static_check(registry, source_dir=source)
        mode = "static"
    else:
        opts.enter_codebase()  # the live check imports the profile's code base
        results = live_check(registry, allowed_prefixes=opts.allowed_prefixes())
        profile = opts.active_profile()
        if _is_profile_registry(registry, profile):
            # A profile's toggles are checked against the profile's built-in scenarios they name.
            from sglfix.scenario import load_scenarios

            names = [sc.name for sc in load_scenarios(builtin_dir=profile.scenarios_dir)]
            results += expectation_check(registry, names)
        mode = "live"
    if caught_by:
        if not Path(tests_root).is_dir():
            from sglfix.common.errors import ConfigError

            raise ConfigError(f"--tests-root {tests_root} is not a directory; give the project root the caught_by paths start from")
        results += caught_by_check(registry, root=tests_root)
    failed = [r for r in results if not r.ok]
    if as_json:
        emit_json({"mode": mode, "source": source, "directory": registry.directory,
                   "ok": not failed, "toggles": [r.to_json() for r in results]})
    else:
        if not results:
            out.print(f"no toggles registered in {registry.directory}: nothing to check")
        for r in results:
            out.print("ok     " if r.ok else "DRIFTED", style="green" if r.ok else "red", end="")
            out.print(f" {r.id}" + (f"  ({', '.join(r.targets)})" if r.targets else ""))
            if not r.ok:
                out.print(r.error)
        out.print(f"{len(results) - len(failed)}/{len(results)} checks pass ({mode}: each toggle and part "
                  "applies and restores cleanly" + ("; every expectation names a scenario" if mode == "live" else "")
                  + ("; each caught_by test fails with its toggle reverted)" if caught_by else ")"))
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
