"""``sglfix toggle``: write a revert toggle from a fix's diff (``from-diff``) or from a commit of a
checkout (``from-git``). The toggle is checked against the profile's installed code base before
it is written: every function revert applies and gives the pre-fix function the diff describes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from sglfix.cli.context import add_group, err, options
from sglfix.common.errors import ConfigError

Pr = typer.Option(..., "--pr", metavar="N", help="The fix's pull-request number (the toggle's id).")
Output = typer.Option(None, "--output", "-o", metavar="FILE", help="Write the toggle here (default: stdout).")


def _source_root(package: str) -> Path:
    from sglfix.common.codebase import package_dir

    root = package_dir(package)
    if root is None:
        raise ConfigError(f"{package} is not installed here: the toggle is built against its installed source")
    return Path(root)


def _build(ctx: typer.Context, text: str, *, where: str, pr: int, output: str | None) -> None:
    from sglfix.report.output import check_output_path, write_atomic
    from sglfix.toggling import fromdiff
    from sglfix.toggling.ids import MAX_PR

    if not 0 < pr <= MAX_PR:
        raise ConfigError(f"--pr {pr}: give the fix's pull-request number (1 to {MAX_PR})")
    check_output_path(output, option="--output")
    opts = options(ctx)
    codebase = opts.codebase()
    root = _source_root(codebase.package)
    plan = fromdiff.plan(
        text, where=where, pr=pr, package=codebase.package, repo_prefix=codebase.repo_prefix, source_root=root
    )
    for note in plan.notes:
        if not note.blocking:
            err.print(f"sglfix: note: {note.where}: {note.why}")
    if plan.refusals:
        # Every hunk that cannot be a function revert, one line each; nothing is written.
        for note in plan.refusals:
            err.print(f"sglfix: error: {note.where}: {note.why}")
        raise typer.Exit(2)
    if not plan.reverts:
        raise ConfigError(f"{where}: no function of {codebase.package} changes in this diff; nothing to revert")
    problems = fromdiff.check(plan, package=codebase.package, source_root=root)
    data = fromdiff.toggle_data(plan)
    text_out = fromdiff.to_yaml(data)
    problems += _validate(text_out, pr=pr, package=codebase.package, allowed=opts.allowed_prefixes())
    if problems:
        # sglfix could not express the diff as a toggle it trusts: its own failure, not the input's.
        for problem in problems:
            err.print(f"sglfix: error: {problem}")
        err.print("sglfix: the toggle was not written; revert these functions by hand (sglfix doctor checks it)")
        raise typer.Exit(1)
    if output is None or output == "-":
        sys.stdout.write(text_out)
    else:
        write_atomic(output, text_out)
    parts = len(data.get("parts", {})) or 1
    where_to = "stdout" if output in (None, "-") else output
    err.print(
        f"sglfix toggle: PR {pr}: {len(plan.reverts)} function(s) in {parts} part(s) -> {where_to}; "
        f"each revert applies to {codebase.package} and gives the pre-fix function of the diff"
    )


def _validate(text: str, *, pr: int, package: str, allowed) -> list[str]:
    """The toggle as a file: it loads as the registry loads it, and each part applies on paper to
    the installed source (what ``run`` checks before any worker starts)."""
    import tempfile

    from sglfix.common.errors import SglfixError
    from sglfix.toggling.doctor import precheck_selections
    from sglfix.toggling.registry import load_registry

    with tempfile.TemporaryDirectory(prefix="sglfix-toggle-") as tmp:
        (Path(tmp) / f"{pr}.yaml").write_text(text)
        try:
            registry = load_registry(tmp)
            toggle = next(iter(registry))
            for rid in toggle.ids:
                precheck_selections(registry.select(rid), package=package, allowed_prefixes=allowed)
        except SglfixError as exc:
            return [str(exc).splitlines()[0]]
    return []


def from_diff_cmd(
    ctx: typer.Context,
    patch: str = typer.Argument(
        ..., metavar="FIX.patch", help="A unified diff (git show, git format-patch, diff -u; - for stdin)."
    ),
    pr: int = Pr,
    output: str | None = Output,
) -> None:
    """A revert toggle from a fix's unified diff, checked against the installed code base."""
    from sglfix.common.yamlio import read_text_file
    from sglfix.toggling.fromdiff import MAX_DIFF_BYTES

    if patch == "-":
        text = sys.stdin.read(MAX_DIFF_BYTES + 1)
        if len(text) > MAX_DIFF_BYTES:
            raise ConfigError(
                f"the diff on stdin is over {MAX_DIFF_BYTES // (1024 * 1024)} MiB; give the fix's diff only"
            )
    else:
        text = read_text_file(patch, what="diff", max_bytes=MAX_DIFF_BYTES)
    _build(ctx, text, where="the diff on stdin" if patch == "-" else patch, pr=pr, output=output)


def from_git_cmd(
    ctx: typer.Context,
    rev: str = typer.Argument(..., metavar="REV", help="The fix's commit (any git revision)."),
    repo: str = typer.Option(".", "--repo", metavar="DIR", help="The checkout holding the commit."),
    pr: int = Pr,
    output: str | None = Output,
) -> None:
    """A revert toggle from a commit of a checkout (its diff against its first parent)."""
    if not repo.strip():
        raise ConfigError("--repo '': the path is empty; give the checkout's directory")
    if not Path(repo).is_dir():
        raise ConfigError(f"--repo {repo}: not a directory; give the checkout's directory")
    if rev.startswith("-"):
        raise ConfigError(f"{rev!r} is not a revision; give a commit (sha, tag, HEAD~1, ...)")
    try:
        proc = subprocess.run(
            ["git", "-C", repo, "format-patch", "-1", "--stdout", "--no-signature", rev, "--"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        raise ConfigError("git is not installed here; save the fix with git format-patch and use from-diff") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["git failed"])[-1]
        raise ConfigError(f"git format-patch {rev} in {repo}: {why}")
    if not proc.stdout.strip():
        raise ConfigError(f"{rev} in {repo} changes no file (a merge commit?); give the fix's own commit")
    _build(ctx, proc.stdout, where=f"{repo}@{rev}", pr=pr, output=output)


def register(app: typer.Typer) -> None:
    add_group(
        app,
        name="toggle",
        help="Write revert toggles from a fix's diff.",
        commands=[("from-diff", from_diff_cmd), ("from-git", from_git_cmd)],
    )
