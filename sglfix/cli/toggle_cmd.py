"""``sglfix toggle``: write a revert toggle from a fix's diff (``from-diff``) or from a commit of a
checkout (``from-git``). The toggle is checked against the profile's installed code base before
it is written: every function revert applies and gives the pre-fix function the diff describes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sglfix.cli.context import add_group, err, options
from sglfix.cli.port_cmd import port_cmd
from sglfix.common.errors import ConfigError

if TYPE_CHECKING:
    from sglfix.toggling.fromdiff import PatchHeader

Pr = typer.Option(..., "--pr", metavar="N", help="The fix's pull-request number (the toggle's id).")
Output = typer.Option(None, "--output", "-o", metavar="FILE", help="Write the toggle here (default: stdout).")
Force = typer.Option(
    False,
    "--force",
    help="Replace an existing --output file, and write a toggle for a PR the toggle files already register.",
)


def _check_target(ctx: typer.Context, *, pr: int, output: str | None, force: bool) -> None:
    """Before any work: never overwrite a file (a hand-written toggle loses its expect: and
    caught_by), never a second toggle for a registered PR, unless --force says so."""
    from sglfix.report.output import check_output_path
    from sglfix.toggling.ids import MAX_PR

    if not 0 < pr <= MAX_PR:
        raise ConfigError(f"--pr {pr}: give the fix's pull-request number (1 to {MAX_PR})")
    check_output_path(output, option="--output")
    if output not in (None, "-") and Path(output).exists() and not force:
        lines = len(Path(output).read_text(errors="replace").splitlines()) if Path(output).is_file() else 0
        raise ConfigError(
            f"--output {output} exists ({lines} lines); give --force to replace it, or write elsewhere (-o NEW.yaml)"
        )
    registered = options(ctx).registry().toggles.get(pr)
    if registered is not None:
        if not force:
            raise ConfigError(
                f"--pr {pr} is already registered ({registered.path}); give --force to write another toggle for it, "
                f"or edit that file"
            )
        err.print(f"sglfix: note: PR {pr} is already registered ({registered.path}); writing another toggle for it")


def _source_root(package: str) -> Path:
    from sglfix.common.codebase import package_dir

    root = package_dir(package)
    if root is None:
        raise ConfigError(f"{package} is not installed here: the toggle is built against its installed source")
    return Path(root)


def _build(
    ctx: typer.Context, text: str, *, where: str, pr: int, output: str | None, header: PatchHeader | None = None
) -> None:
    from sglfix.report.output import write_atomic
    from sglfix.toggling import fromdiff

    opts = options(ctx)
    codebase = opts.codebase()
    root = _source_root(codebase.package)
    plan = fromdiff.plan(
        text,
        where=where,
        pr=pr,
        package=codebase.package,
        repo_prefix=codebase.repo_prefix,
        source_root=root,
        header=header,
    )
    if plan.only_adds_files and not plan.refusals:
        # Documented as "a new file needs no revert of its own": a diff of nothing else has none.
        raise ConfigError(
            f"{where} only adds new files ({', '.join(plan.added_files)}): nothing existed before the fix, "
            f"so no function of {codebase.package} can be reverted; give the diff of a fix that changes "
            "functions the code base has"
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
    force: bool = Force,
) -> None:
    """A revert toggle from a fix's unified diff, checked against the installed code base."""
    _check_target(ctx, pr=pr, output=output, force=force)
    from sglfix.common.yamlio import read_text_file
    from sglfix.toggling.diffread import DIFF_WANTED
    from sglfix.toggling.fromdiff import MAX_DIFF_BYTES

    if patch == "-":
        text = sys.stdin.read(MAX_DIFF_BYTES + 1)
        if len(text) > MAX_DIFF_BYTES:
            raise ConfigError(
                f"the diff on stdin is over {MAX_DIFF_BYTES // (1024 * 1024)} MiB; give the fix's diff only"
            )
    else:
        text = read_text_file(patch, what="diff", max_bytes=MAX_DIFF_BYTES, give=DIFF_WANTED)
    _build(ctx, text, where="the diff on stdin" if patch == "-" else patch, pr=pr, output=output)


# git as a script runs it: no pager, no colour, paths unquoted, and (diff-tree being plumbing) no
# external diff, textconv, prefix or rename setting of the user's configuration in the diff.
_GIT = ("git", "--no-pager", "-c", "core.quotepath=off", "-c", "color.ui=never")
_GIT_TIMEOUT = 60


def _git(repo: str, *args: str) -> tuple[int, bytes, str]:
    """git's exit code, its output as bytes (each caller decodes it as strictly as it needs)
    and its last line on stderr."""
    try:
        proc = subprocess.run([*_GIT, "-C", repo, *args], capture_output=True, timeout=_GIT_TIMEOUT)
    except FileNotFoundError:
        raise ConfigError("git is not installed here; save the fix with git format-patch and use from-diff") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"git {args[0]} in {repo} took over {_GIT_TIMEOUT} s; save the fix's diff and use from-diff"
        ) from None
    why = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["git failed"])[-1]
    return proc.returncode, proc.stdout, why


def _lines(raw: bytes) -> str:
    """Text as a text-mode pipe would give it: CRLF and CR read as LF."""
    return raw.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _diff_text(raw: bytes, *, rev: str, repo: str) -> str:
    """The diff as text; a byte that is not UTF-8 (a file in another encoding) would reach the
    toggle as a replacement character, so it is refused, naming the file it is in."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = raw.rfind(b"\ndiff --git ", 0, exc.start) + 1
        header = raw[head : raw.find(b"\n", head)].decode("utf-8", "backslashreplace")
        path = header.split(" b/", 1)[-1] if header.startswith("diff --git ") else "?"
        line = raw[: exc.start].count(b"\n") - raw[:head].count(b"\n") + 1
        raise ConfigError(
            f"{rev} in {repo}: its diff of {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line} "
            f"of that file's diff); a toggle is UTF-8: save the diff, convert it to UTF-8 and use from-diff"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _commit_diff(repo: str, rev: str) -> tuple[str, PatchHeader, list[str]]:
    """REV's diff against its first parent (a merge's too: what it brought in), its header from
    its own message, and its parents."""
    from sglfix.toggling.fromdiff import commit_header

    # REV does not start with '-' (refused before), and every later argument is a full sha.
    code, out, why = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    if code != 0:
        raise ConfigError(f"{rev} is not a commit of {repo} ({why}); give the fix's commit (sha, tag, HEAD~1, ...)")
    sha = _lines(out).strip()
    code, out, why = _git(
        repo, "log", "-1", "--no-show-signature", "--encoding=UTF-8", "--format=%P%x00%s%x00%b", sha, "--"
    )
    log = _lines(out)
    if code != 0 or log.count("\0") < 2:
        raise ConfigError(f"git log {rev} in {repo}: {why}")
    parents, subject, body = log.split("\0", 2)
    first = parents.split()[:1]
    if not first:
        raise ConfigError(
            f"{rev} in {repo} is a root commit (no parent): every file in it is new, so there is no pre-fix "
            f"code to revert to; give the fix's own commit"
        )
    code, out, why = _git(
        repo,
        "diff-tree",
        "-p",
        "-r",
        "-M",  # renames as git format-patch shows them
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        first[0],
        sha,
    )
    if code != 0:
        raise ConfigError(f"git diff {rev}^1 {rev} in {repo}: {why}")
    if not out.strip():
        raise ConfigError(
            f"{rev} in {repo} changes no file against its first parent {first[0][:12]}; give the fix's own commit"
        )
    return _diff_text(out, rev=rev, repo=repo), commit_header(sha, subject, body), parents.split()


def from_git_cmd(
    ctx: typer.Context,
    rev: str = typer.Argument(..., metavar="REV", help="The fix's commit (any git revision)."),
    repo: str = typer.Option(".", "--repo", metavar="DIR", help="The checkout holding the commit."),
    pr: int = Pr,
    output: str | None = Output,
    force: bool = Force,
) -> None:
    """A revert toggle from a commit of a checkout (its diff against its first parent, a merge's
    too; the title and description from the commit's own message)."""
    _check_target(ctx, pr=pr, output=output, force=force)
    if not repo.strip():
        raise ConfigError("--repo '': the path is empty; give the checkout's directory")
    if not Path(repo).is_dir():
        raise ConfigError(f"--repo {repo}: not a directory; give the checkout's directory")
    if rev.startswith("-"):
        raise ConfigError(f"{rev!r} is not a revision; give a commit (sha, tag, HEAD~1, ...)")
    diff, header, parents = _commit_diff(repo, rev)
    if len(parents) > 1:
        err.print(
            f"sglfix: note: {rev} is a merge: the toggle reverts what it brought in against its first "
            f"parent {parents[0][:12]}, under the merge's own title"
        )
    _build(ctx, diff, where=f"{repo}@{rev}", pr=pr, output=output, header=header)


def register(app: typer.Typer) -> None:
    add_group(
        app,
        name="toggle",
        help="Write revert toggles from a fix's diff, or port them onto another release.",
        commands=[("from-diff", from_diff_cmd), ("from-git", from_git_cmd), ("port", port_cmd)],
    )
