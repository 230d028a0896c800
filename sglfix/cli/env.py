"""``sglfix env``: what the revert variable (``envs.REVERT_PR``) selects now, under which profile, and whether the
start-up hook that applies it in every Python process is installed."""

from __future__ import annotations

import os

import typer

from sglfix.cli.context import emit_json, options, out
from sglfix.common.environ import envs


def env_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    from sglfix.toggling.env import ENV_VAR, selected_from_env

    opts = options(ctx)
    value = envs.REVERT_PR.get()
    profile, why = _profile(opts)
    explicit = opts.toggles is not None or envs.SGLFIX_TOGGLES_DIR.get()
    registry = opts.registry(None if explicit else profile.toggles_dir)
    selections = selected_from_env(registry=registry)
    data = {
        "variable": ENV_VAR,
        "value": value,
        "profile": profile.name,
        "profile_why": why,
        "toggles": registry.directory,
        "codebase": _codebase(profile),
        "startup_hook": _installed_hook(),
        "selected": [
            {"id": s.id, "title": s.toggle.title, "summary": s.part.summary, "targets": list(s.part.targets)}
            for s in selections
        ],
    }
    if as_json:
        emit_json(data)
        return
    hook = data["startup_hook"]
    out.print(
        f"start-up hook: {hook}"
        if hook
        else "start-up hook: not installed (pip install sglfix puts zz-sglfix-startup.pth in site-packages); "
        "only explicit maybe_revert_pr_fix() calls apply the variable"
    )
    out.print(f"profile: {profile.name} ({why})")
    out.print(f"toggles: {registry.directory}")
    cb = data["codebase"]
    if cb is not None:
        out.print(f"code base: {cb['distribution']} {cb['version']} at {cb['path']}")
    if not selections:
        out.print(
            f"{ENV_VAR}={value!r}: no fix is reverted"
            if value is not None
            else f"{ENV_VAR} is not set: no fix is reverted"
        )
        return
    out.print(f"{ENV_VAR}={value!r} reverts:")
    for item in data["selected"]:
        out.print(f"  {item['id']}  {item['summary']}  ({', '.join(item['targets'])})")


def _profile(opts):
    """The profile a process started with this environment applies the variable under, and why
    (the start-up hook's own choice; ``--profile`` names it outright)."""
    if opts.profile is not None:
        return opts.profile, f"--profile {opts.profile.asked or opts.profile.name}"
    from sglfix.toggling.profiles import resolve_profile

    chosen = resolve_profile(follow_imports=True)
    if chosen.profile is not None:
        return chosen.profile, chosen.why
    # Decided by the process's first import; shown under the engine's profile, what production runs.
    return chosen.candidates[0][1], chosen.why


def _codebase(profile) -> dict | None:
    """Where the profile's engine is imported from here, and its version (None: the
    reproduction, or not importable)."""
    if profile.is_reproduction:
        return None
    from sglfix.codebases import installed

    found = installed(profile)
    return found.to_json() if found is not None else None


def _installed_hook() -> str | None:
    import site
    import sys

    dirs = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else sys.path
    for directory in dirs:
        path = os.path.join(directory, "zz-sglfix-startup.pth")
        if os.path.isfile(path):
            return path
    return None


def register(app: typer.Typer) -> None:
    from sglfix.common.environ import envs

    app.command("env", help=f"Show what {envs.REVERT_PR.name} selects now.")(env_cmd)
