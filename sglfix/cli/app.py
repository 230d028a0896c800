"""The ``sglfix`` entry point: the typer app, global options, and one-line error handling.

Exit codes: 0 ok, 1 a check failed, 2 bad input (one line, no traceback unless ``--debug``
anywhere on the line), 125 every cell was skipped ("cannot test this", for ``git bisect run``),
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperGroup
from typer.main import get_command

from sglfix.cli.complete import profile_names
from sglfix.cli.context import Options, err, options
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError, SglfixError

# Flags read from the whole line (they hold for every command, wherever they stand).
LINE_FLAGS = ("--debug", "--git-bisect")

# Global options accepted after the command too (``sglfix doctor --profile NAME``).
_GLOBAL_WITH_VALUE = ("--profile", "--release", "--wheels", "--codebase-version")


class SglfixGroup(TyperGroup):
    """The root command. sglfix's own options are read wherever they stand on the line (each
    command below takes them as hidden options); the callback records them, and the work they ask
    for starts once the command that runs is parsed. Every way a command ends is one line on
    stderr with its exit code, the same for the console script and for anything invoking the app
    (``typer.testing.CliRunner``)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            _take_line_options(command)

    def invoke(self, ctx: typer.Context) -> Any:
        """Each level's callback in turn (the root's records the options), the command that runs
        parsed before any of the work sglfix's own options ask for (a release fetched, a profile's
        toggle files loaded): a typo anywhere on the line is one line, before any download."""
        with contextlib.ExitStack() as stack:
            level = stack.enter_context(ctx)
            while True:
                group = level.command
                args = [*level._protected_args, *level.args]
                level._protected_args, level.args = [], []
                if not args:  # a group given bare: its help, once the options are checked
                    if level is ctx:
                        _run_callback(self, ctx)
                    _settle(level, runs=False)
                    if level is ctx:
                        typer.echo(ctx.get_help())
                        raise typer.Exit(0)
                    return _run_callback(group, level)
                name, command, args = group.resolve_command(level, args)
                level.invoked_subcommand = name
                _run_callback(group, level)
                sub = stack.enter_context(command.make_context(name, args, parent=level))
                if not isinstance(command, TyperGroup):
                    _settle(sub, runs=True)
                    return command.invoke(sub)
                level = sub

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the line; its exit code (``standalone_mode``: exit with it). ``--debug`` and
        ``--git-bisect`` are read from the whole line first: they decide how even a line that
        does not parse ends."""
        line = list(sys.argv[1:] if args is None else args)
        debug = LINE_FLAGS[0] in line or envs.SGLFIX_DEBUG.get()
        git_bisect = LINE_FLAGS[1] in line
        if not isinstance(extra.get("obj"), Options):
            extra["obj"] = Options(debug=debug, argv=["sglfix", *_recorded(line)], git_bisect=git_bisect)
        code = _ended(
            lambda: super(SglfixGroup, self).main(
                args=line,
                prog_name=prog_name or "sglfix",
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            ),
            debug=debug,
        )
        code = _bisect_code(code or 0) if git_bisect else code or 0
        if not standalone_mode:
            return code
        sys.exit(code)


def _run_callback(group: TyperGroup, ctx: typer.Context) -> Any:
    """``group``'s own callback, without running its subcommand."""
    return super(TyperGroup, group).invoke(ctx)


def _take_line_options(command: Any) -> None:
    """Give ``command`` (and every command below it) sglfix's own options as hidden ones, so that
    they parse wherever they stand on the line; what they say is recorded for the root."""
    have = {name for p in command.params for name in (*p.opts, *p.secondary_opts)}
    command.params.extend(p for p in _line_options() if not have & {*p.opts, *p.secondary_opts})
    for sub in getattr(command, "commands", {}).values():
        _take_line_options(sub)


def _record(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> None:
    if value is not None and not ctx.resilient_parsing:
        options(ctx).given[param.name] = value


def _anywhere(
    profile: str | None = typer.Option(
        None, "--profile", hidden=True, expose_value=False, callback=_record, autocompletion=profile_names
    ),
    release: str | None = typer.Option(None, "--release", hidden=True, expose_value=False, callback=_record),
    wheels: str | None = typer.Option(None, "--wheels", hidden=True, expose_value=False, callback=_record),
    codebase_version: str | None = typer.Option(
        None, "--codebase-version", hidden=True, expose_value=False, callback=_record
    ),
    debug: bool = typer.Option(False, "--debug", hidden=True, expose_value=False),
    git_bisect: bool = typer.Option(False, "--git-bisect", hidden=True, expose_value=False),
) -> None:
    """The options of the root that every command below it takes too (read by ``SglfixGroup.main``
    and recorded by ``_record``; never passed to a command)."""


def _line_options() -> list:
    """Fresh parameters for ``_anywhere``'s options, made by typer as it makes any command's."""
    carrier = typer.Typer(add_completion=False)
    carrier.command()(_anywhere)
    return list(get_command(carrier).params)


app = typer.Typer(
    cls=SglfixGroup,
    name="sglfix",
    add_completion=True,
    no_args_is_help=False,
    help="Revert historical attention-metadata fixes and see which one causes which divergence. "
    "--git-bisect (anywhere on the line): exit as git bisect run reads it, 0 good, 1 bad, 125 this "
    "commit cannot be tested.",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def _main(  # noqa: PLR0913 - typer reads the global options from this signature
    ctx: typer.Context,
    toggles: str | None = typer.Option(
        None,
        "--toggles",
        metavar="DIR",
        help=f"Toggle files directory (default: the profile's; env {envs.SGLFIX_TOGGLES_DIR.name}).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        metavar="NAME",
        autocompletion=profile_names,
        help=f"Toggle set for one code base: reproduction (default) or a profile folder's name (the built-in profiles/ and {envs.SGLFIX_PROFILES_PATH.name}; env {envs.SGLFIX_PROFILE.name}).",
    ),
    release: str | None = typer.Option(
        None,
        "--release",
        metavar="VERSION",
        help="Run against this sglang release, fetched once into sglfix's cache (its Python files and the light packages it pins; nothing installed); implies --profile sglang unless a profile is named.",
    ),
    wheels: str | None = typer.Option(
        None,
        "--wheels",
        metavar="DIR",
        help="With --release (or bisect --releases): take the releases and the light packages they pin from this directory of wheels (offline), not the package index.",
    ),
    codebase_version: str | None = typer.Option(
        None,
        "--codebase-version",
        metavar="V",
        help=f"The version of the engine's source tree when it records none (a git clone without its generated _version.py, no release tag in reach): picks its profile and each toggle's variant. Env {envs.SGLFIX_CODEBASE_VERSION.name}.",
    ),
    allow_target: list[str] = typer.Option(
        [], "--allow-target", metavar="PREFIX", help="Also allow patch targets under this module prefix (repeatable)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (accepted anywhere on the line)."),
    git_bisect: bool = typer.Option(False, "--git-bisect", hidden=True),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """Records the options given before the command; ``SglfixGroup`` acts on them (``_settle``)
    once the command that runs is parsed."""
    opts = options(ctx)
    if version:
        from sglfix import __version__

        typer.echo(f"sglfix {__version__}")
        raise typer.Exit(0)
    given = {"toggles": toggles, "profile": profile, "release": release, "wheels": wheels}
    opts.given.update({name: value for name, value in given.items() if value is not None})
    if codebase_version is not None:
        opts.given["codebase_version"] = codebase_version
    opts.given["allow_target"] = list(allow_target)
    opts.debug = opts.debug or debug
    opts.git_bisect = opts.git_bisect or git_bisect


def _settle(ctx: typer.Context, *, runs: bool) -> None:
    """Check and act on sglfix's own options, wherever on the line they were given, now that the
    line is parsed (``ctx``: the command that runs, ``runs``; or a group given bare, whose help is
    all that follows): a release fetched and put first on the path, the profile and its toggle
    files loaded, before the command starts."""
    opts = options(ctx)
    given = opts.given
    toggles, profile, release = given.get("toggles"), given.get("profile"), given.get("release")
    wheels, codebase_version = given.get("wheels"), given.get("codebase_version")
    allow_target: list[str] = list(given.get("allow_target", []))
    command = [c.info_name or "" for c in _chain(ctx)]
    if toggles is not None and not toggles.strip():
        raise ConfigError("--toggles '': the directory is empty; give a toggle files directory (or leave it out)")
    for prefix in allow_target:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", prefix):
            raise ConfigError(
                f"--allow-target {prefix!r} is not a module prefix; give a dotted module name like mypkg.kernels"
            )
    if wheels is not None and release is None:
        if command[:1] != ["bisect"]:
            raise ConfigError("--wheels DIR holds the wheels of --release VERSION: give --release with it")
        opts.wheels = wheels  # bisect --releases A..B takes its releases from there
    if codebase_version is not None:
        _given_version(codebase_version, release=release)
    if release is not None and not runs:
        return  # no command to run on it: its help, nothing fetched
    if release is not None:
        profile = _use_release(ctx, release, command=command, wheels=wheels, profile=profile, toggles=toggles)
        opts.release = release.strip()
    if profile is not None:
        from sglfix.toggling.profiles import get_profile

        if toggles is not None:
            raise ConfigError("--profile and --toggles both name the toggle files; give one of them")
        opts.profile = get_profile(profile)
        toggles = opts.profile.toggles_dir
    opts.toggles = toggles
    opts.allow = tuple(allow_target)
    if codebase_version is not None:
        _check_given_version(opts, codebase_version)
    if toggles is not None:
        # Checked now so every command (and every worker) sees one valid directory.
        from sglfix.toggling.registry import load_registry

        load_registry(toggles)


def _chain(ctx: typer.Context) -> list[typer.Context]:
    """The contexts from the root's command down to ``ctx`` (the root left out)."""
    chain = []
    while ctx.parent is not None:
        chain.append(ctx)
        ctx = ctx.parent
    return chain[::-1]


def _given_version(text: str, *, release: str | None) -> None:
    """``--codebase-version V``: the version of a source tree that records none, for this process
    and every process it starts (workers, the start-up hook)."""
    from sglfix.codebases.releases import check_version

    version = check_version(text, option="--codebase-version")
    if release is not None:
        raise ConfigError(
            "--codebase-version names a source tree's version, --release runs a release of its own: give one"
        )
    envs.SGLFIX_CODEBASE_VERSION.set(version)


def _check_given_version(opts: Options, given: str) -> None:
    """``--codebase-version`` acts on an engine's source tree that records no version; anywhere
    else it is refused: the reproduction has none to give, and a build's record is not overridden."""
    from sglfix.codebases import check_given_version, installed

    cb = opts.active_profile()
    if cb.is_reproduction:
        raise ConfigError(
            f"--codebase-version {given} names the version of an engine's source tree, but the profile in "
            "use is the reproduction (sglfix's own code); give --profile sglang (or drop --codebase-version)"
        )
    found = installed(cb)
    if found is not None:
        check_given_version(found)


def _use_release(
    ctx: typer.Context,
    release: str,
    *,
    command: list[str],
    wheels: str | None,
    profile: str | None,
    toggles: str | None,
) -> str | None:
    """Check the release against the profiles and the rest of the line (``ctx``: the command
    that runs, ``command`` its names), then fetch it (unless
    cached) and put it in front of this process's and its workers' path; the profile to use: the
    one named, else the one following the engine. Nothing is downloaded for a line refused."""
    from sglfix.codebases import get_codebase, profiles
    from sglfix.codebases.releases import check_version, fetch_release, use_release

    version = check_version(release, option="--release")
    engines = sorted({r.distribution for r in profiles().values() if r.distribution})
    if len(engines) != 1:
        raise ConfigError(f"--release: the profiles name {len(engines)} engines ({', '.join(engines)}); expected one")
    engine = engines[0]
    named, why = profile, f"--profile {profile}"
    if named is None:
        named = envs.SGLFIX_PROFILE.get()
        why = f"{envs.SGLFIX_PROFILE.name}={named}"
    if named is None and toggles is not None:
        raise ConfigError(
            f"--release {version} runs a release of {engine}; --toggles DIR alone replays the reproduction: "
            f"give {envs.SGLFIX_PROFILE.name}=PROFILE (the {engine} profile those toggles are for) with it, "
            "or drop --toggles"
        )
    records = [r for r in profiles().values() if r.distribution == engine]
    if named is not None and named.strip() not in (engine, records[0].package):
        record = get_codebase(named, what="--profile" if profile is not None else envs.SGLFIX_PROFILE.name)
        if record.distribution != engine:
            raise ConfigError(
                f"--release {version} runs {engine} {version}, but {why} replays {record.label}; "
                f"drop {why.split('=')[0].split()[0]} (the release picks its {engine} profile) or --release"
            )
        if not record.covers(version):
            others = [r.name for r in records if r.covers(version)]
            pick = (
                f"give --profile {others[0]}"
                if others
                else f"write a profile for {version} (docs/how-to/add-a-profile.md)"
            )
            raise ConfigError(
                f"--release {version}: {why} is written for {engine} {record.versions or record.version}; {pick}"
            )
    else:
        _release_followed(version, records)
    _goes_with_release(ctx, command=command, release=version)
    use_release(fetch_release(engine, version, wheels=wheels, package=records[0].package))
    if profile is None and named is not None:
        return None  # SGLFIX_PROFILE names it: resolved from there, as without --release
    return named if named is not None else engine


def _release_followed(version: str, records: list) -> None:
    """A release the engine's profiles can follow: one covers it, or it is newer than all of
    them (the newest then runs it, and reverts that no longer apply are findings)."""
    from packaging.version import Version

    if any(r.covers(version) for r in records):
        return
    oldest = min(records, key=lambda r: Version(r.version))
    if Version(version) < Version(oldest.version):
        raise ConfigError(
            f"--release {version}: no profile covers {oldest.distribution} {version} (the oldest, {oldest.name}, "
            f"covers {oldest.versions or oldest.version}); give a release it covers, or write a profile for "
            f"{version} (docs/how-to/add-a-profile.md)"
        )


def _goes_with_release(ctx: typer.Context, *, command: list[str], release: str) -> None:
    """Refuse what --release does not go with on the parsed line (``ctx``: the command that runs)."""
    if command[:1] == ["bisect"] and ctx.params.get("releases"):
        raise ConfigError(
            f"--release {release} and bisect --releases both choose what runs: give bisect --releases A..B alone"
        )
    if command == ["toggle", "port"] and ctx.params.get("source") is not None:
        raise ConfigError(
            f"--source {ctx.params['source']} and --release {release} both name the source to port onto: give one"
        )


def _register_commands() -> None:
    from sglfix.cli import (
        bisect_cmd,
        cache_cmd,
        doctor,
        env,
        list_cmd,
        matrix,
        mutate_cmd,
        ray_cmd,
        report_cmd,
        run,
        scenarios,
        schema_cmd,
        search_cmd,
        show,
        toggle_cmd,
    )

    for module in (
        list_cmd,
        show,
        doctor,
        env,
        scenarios,
        run,
        matrix,
        bisect_cmd,
        mutate_cmd,
        search_cmd,
        ray_cmd,
        report_cmd,
        toggle_cmd,
        schema_cmd,
        cache_cmd,
    ):
        module.register(app)


_register_commands()


def _click_exception_type() -> type:
    # Newer typer vendors click as typer._click and no longer installs click itself.
    try:
        from typer._click.exceptions import ClickException
    except ImportError:  # pragma: no cover - older typer on top of click
        from click.exceptions import ClickException
    return ClickException


def _recorded(args: list[str]) -> list[str]:
    """The line as a report records it: sglfix's own options first (``--profile NAME``,
    ``--release VERSION``, ``--wheels DIR``, ``--codebase-version V`` wherever they were given),
    ``--debug`` and ``--git-bisect`` left out (they change how sglfix answers, not what runs)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in LINE_FLAGS:
            i += 1
            continue
        if arg in _GLOBAL_WITH_VALUE and i + 1 < len(args):
            front += args[i : i + 2]
            i += 2
            continue
        if arg.startswith(tuple(f"{o}=" for o in _GLOBAL_WITH_VALUE)):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def main(argv: list[str] | None = None) -> None:
    """The ``sglfix`` console script (``python -m sglfix``): exits with the line's exit code."""
    app(args=argv, prog_name="sglfix")


def _bisect_code(code: int) -> int:
    """What ``git bisect run`` must read: 0 good, 1 bad, 125 this commit cannot be tested (sglfix
    refused it before any cell: no profile covers its version, a scenario, backend or revert it
    does not have), never 2 (git would read bad). The commands that run cells say 125 themselves
    for an ERROR cell or a revert that no longer applies there."""
    return 125 if code == 2 else code


def _ended(run: Callable[[], Any], *, debug: bool) -> int | None:
    """The exit code of ``run`` (the parsed line's command); every way it can end is one line on
    stderr (``--debug``: and the traceback)."""
    from sglfix.common.signals import signals_raise

    usage_error = _click_exception_type()
    try:
        # SIGTERM raises for the whole command, report writing included: a report file is whole
        # or absent, and the line below says so with exit 143.
        with signals_raise():
            code = run()
        if code == 130:  # typer turns KeyboardInterrupt into exit code 130; the pool has unwound by now
            err.print("sglfix: interrupted; workers stopped")
        return code
    except typer.Exit as exc:
        if exc.exit_code == 130:  # typer turns KeyboardInterrupt into Exit(130); the pool has unwound by now
            err.print("sglfix: interrupted; workers stopped")
        return exc.exit_code
    except typer.Abort:
        err.print("sglfix: aborted")
        return 130
    except usage_error as exc:
        if debug:
            traceback.print_exc()
        # One line, whatever click wraps (its "Choose from:" lists one choice per line).
        message = " ".join(exc.format_message().split())
        err.print(f"sglfix: error: {message} (see sglfix --help)")
        return 2
    except SglfixError as exc:
        if debug:
            traceback.print_exc()
        lines = str(exc).splitlines()
        err.print(f"sglfix: error: {lines[0] if lines else type(exc).__name__}")
        if lines[1:] and exc.exit_code == 1:
            err.print("\n".join(lines[1:]))
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        err.print("sglfix: interrupted; workers stopped")
        return 130
    except SystemExit:
        raise
    except BaseException as exc:
        return _unexpected(exc, debug=debug)


def _unexpected(exc: BaseException, *, debug: bool) -> int:
    """SIGTERM from the worker pool's signal guard (an exception with an exit code), or a failure
    of sglfix itself: one line, exit 2."""
    code = getattr(exc, "exit_code", None)
    if code is not None:
        err.print("sglfix: terminated; workers stopped")
        return code
    if debug:
        traceback.print_exc()
    err.print(f"sglfix: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
    return 2
