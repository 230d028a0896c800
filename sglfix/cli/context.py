"""Options shared by every command, carried in the typer context (never in module globals)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

import typer
from rich.console import Console

from sglfix.common.environ import envs

__all__ = ["Options", "emit_json", "err", "options", "out"]


# Wide when piped, so names are not cut in logs and CI output.
def _piped_width() -> int:
    """COLUMNS when it is a usable width, else 200 (a bad value is the terminal's, never fatal)."""
    try:
        width = int(os.environ.get("COLUMNS", "").strip())
    except ValueError:
        return 200
    return width if 20 <= width <= 10000 else 200


class _StreamConsole:
    """The rich console of whatever ``sys.stdout`` (``sys.stderr``) is when it prints: made for
    that stream (its width, whether it takes colour) and made again when the stream or COLUMNS
    changes, so that output captured in-process (a test, ``typer.testing.CliRunner``) reads as
    the console script's does."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._made: tuple[object, str | None, Console] | None = None

    def _console(self) -> Console:
        stream = sys.stderr if self._stderr else sys.stdout
        # A live display (a progress bar) proxies the stream it draws on while it runs: the same one.
        stream = getattr(stream, "rich_proxied_file", stream)
        columns = os.environ.get("COLUMNS")
        made = self._made
        if made is None or made[0] is not stream or made[1] != columns:
            # markup=False everywhere user text is printed: scenario names, YAML and messages are data.
            console = Console(
                stderr=self._stderr,
                width=None if self._stderr or _isatty(stream) else _piped_width(),
                highlight=False,
                soft_wrap=True,
                markup=False,
                emoji=False,
            )
            self._made = made = (stream, columns, console)
        return made[2]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    # rich's Live holds the console in ``with`` blocks (a progress bar on stderr).
    def __enter__(self) -> Console:
        return self._console().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._console().__exit__(*exc)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or closed
        return False


out: Console = _StreamConsole(stderr=False)  # type: ignore[assignment]
err: Console = _StreamConsole(stderr=True)  # type: ignore[assignment]


@dataclass
class Options:
    toggles: str | None = None
    profile: object = None  # the --profile given (sglfix.codebases.Profile), if any
    allow: tuple[str, ...] = ()
    debug: bool = False
    argv: list[str] = field(default_factory=list)
    wheels: str | None = None  # --wheels DIR without --release: bisect --releases takes its releases there
    release: str | None = None  # --release VERSION: the release this command runs (fetched, first on the path)
    git_bisect: bool = False  # --git-bisect: exit 125 where the commit cannot be tested (sglfix.cli.app)
    # sglfix's own options as the line gives them (before or after the command), by name; the
    # fields above are set from them once the command that runs is parsed (sglfix.cli.app).
    given: dict[str, Any] = field(default_factory=dict)

    def allowed_prefixes(self) -> tuple[str, ...] | None:
        if not self.allow:
            return None
        from sglfix.patching.targets import DEFAULT_ALLOWED_PREFIXES

        return tuple(DEFAULT_ALLOWED_PREFIXES) + self.allow

    def active_profile(self):
        """The profile of this command: ``--profile``, else ``SGLFIX_PROFILE``, else the reproduction."""
        from sglfix.toggling.profiles import resolve_profile

        given = self.profile
        return resolve_profile(option=(given.asked or given.name) if given is not None else None).profile

    def codebase(self, *, check: bool = True):
        """The code base this command replays through; ``check``: it must be installed, in a
        version the profile covers (one-line ConfigError, exit 2, before any cell)."""
        from sglfix.codebases import check_installed

        cb = self.active_profile()
        if check and not cb.is_reproduction:
            name = cb.asked or cb.name
            shown = f"--profile {name}" if self.profile is not None else f"{envs.SGLFIX_PROFILE.name}={name}"
            check_installed(cb, what=shown)
        return cb

    def enter_codebase(self):
        """Make this process able to import the profile's code base (checked installed, stand-ins
        for what a CPU box lacks, Triton's interpreter without a GPU) before a command imports
        its targets, as a worker does; the code base."""
        cb = self.codebase()
        if not cb.is_reproduction:
            from sglfix.codebases import activate
            from sglfix.execution.devices import has_cuda_device

            if not has_cuda_device():
                os.environ.setdefault("TRITON_INTERPRET", "1")  # read when sglang's kernels are decorated
            activate(cb)
        return cb

    def registry(self, directory: str | None = None):
        from sglfix.toggling.registry import load_registry

        registry = load_registry(directory or self.toggles)
        # Only when nothing chose the toggle files (--toggles, SGLFIX_TOGGLES_DIR): a choice is no accident.
        if directory is None and self.toggles is None and not envs.SGLFIX_TOGGLES_DIR.get():
            _note_other_toggles(registry)
        return registry


_NOTED: set[str] = set()


def _note_other_toggles(registry) -> None:
    """The toggle files of a ``toggles/`` folder in the current directory (a checkout of sglfix)
    when they differ from the reproduction's toggle files in use: a regular install reads its own
    copy, so a toggle file added, edited or removed in the checkout would be ignored. Never
    silently: one line, once, naming the files and ``--toggles``."""
    here = os.path.abspath("toggles")
    if here in _NOTED or not os.path.isdir(here):
        return
    try:
        if os.path.samefile(here, os.fspath(registry.directory)):
            return
        from sglfix.toggling.profiles import resolve_profile

        # ./toggles is the reproduction's folder: another profile's toggle files are no copy of it.
        if not resolve_profile().profile.is_reproduction:
            return
        mine, theirs = _toggle_files(here), _toggle_files(os.fspath(registry.directory))
    except OSError:
        return
    found = [
        ("edited", sorted(n for n in mine.keys() & theirs.keys() if mine[n] != theirs[n])),
        ("new", sorted(mine.keys() - theirs.keys())),
        ("missing here", sorted(theirs.keys() - mine.keys())),
    ]
    if not any(names for _, names in found):
        return
    _NOTED.add(here)
    shown = "; ".join(
        ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") + f" {what}"
        for what, names in found
        if names
    )
    err.print(
        f"sglfix: note: ./toggles differs from the toggle files in use ({registry.directory}): {shown}; "
        "give --toggles toggles to use ./toggles",
        highlight=False,
        markup=False,
    )


def _toggle_files(directory: str) -> dict[str, bytes]:
    """The toggle files a registry reads from ``directory`` (``*.yaml``, and their
    ``variants/*.yaml``), by name, with their contents."""
    out: dict[str, bytes] = {}
    for sub in ("", "variants"):
        folder = os.path.join(directory, sub)
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.endswith(".yaml") and os.path.isfile(path):
                with open(path, "rb") as fh:
                    out[f"{sub}/{name}" if sub else name] = fh.read()
    return out


def options(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    if not isinstance(obj, Options):
        obj = Options()
        ctx.find_root().obj = obj
    return obj


def emit_json(data: object) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def add_group(app: typer.Typer, *, name: str, help: str, commands: list[tuple[str, Any]]) -> None:
    """A group of subcommands (``sglfix report``, ``sglfix toggle``); given bare, it prints its
    help, as bare ``sglfix`` does."""
    group = typer.Typer(
        name=name, help=help, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None
    )

    @group.callback(invoke_without_command=True)
    def _bare(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)

    for command, fn in commands:
        group.command(command)(fn)
    app.add_typer(group, name=name)
