"""A mutant as a unified diff in the code base's own paths (what ``--apply`` replays, as it would a
candidate fix: ``sglfix.toggling.candidate.load_candidate`` reads it), and as ``sglfix mutate
--show ID`` prints it."""

from __future__ import annotations

from sglfix.mutation.model import Mutant

__all__ = ["CONTEXT", "mutant_diff", "show_mutant"]

CONTEXT = 3  # lines of context either side, as git writes them
_NO_NEWLINE = "\\ No newline at end of file"


def mutant_diff(*, path: str, file_text: str, line: int, end_line: int, mutated: str, title: str) -> str:
    """The diff that replaces lines ``line..end_line`` (1-based, inclusive) of ``file_text`` with
    the lines of ``mutated``: a ``Subject:`` line carrying ``title``, git's file headers for
    ``path`` and one hunk with ``CONTEXT`` lines of context."""
    lines = file_text.splitlines()
    if not 1 <= line <= end_line <= len(lines):
        raise ValueError(f"{path}: lines {line}-{end_line} are not lines of the file ({len(lines)} lines)")
    new = mutated.split("\n")
    start = max(1, line - CONTEXT)
    stop = min(len(lines), end_line + CONTEXT)
    before = lines[start - 1 : line - 1]
    removed = lines[line - 1 : end_line]
    after = lines[end_line:stop]
    # Without a final newline, git marks the file's last line wherever the hunk shows it.
    open_end = stop == len(lines) and not file_text.endswith("\n")
    old_len = len(before) + len(removed) + len(after)
    new_len = len(before) + len(new) + len(after)
    out = [
        f"Subject: {' '.join(title.split())}",
        "",
        f"diff --git a/{path} b/{path}",
        f"--- a/{path}",
        f"+++ b/{path}",
        f"@@ -{start},{old_len} +{start},{new_len} @@",
    ]
    out += [" " + s for s in before]
    out += ["-" + s for s in removed]
    if open_end and not after:
        out.append(_NO_NEWLINE)
    out += ["+" + s for s in new]
    if open_end and not after:
        out.append(_NO_NEWLINE)
    out += [" " + s for s in after]
    if open_end and after:
        out.append(_NO_NEWLINE)
    return "\n".join(out) + "\n"


def show_mutant(m: Mutant) -> str:
    """What ``sglfix mutate --show ID`` prints: where the mutant is and what it changes, then its diff."""
    at = f"{m.path}:{m.line}" if m.end_line == m.line else f"{m.path}:{m.line}-{m.end_line}"
    head = [
        f"mutant    {m.id}",
        f"function  {m.function}",
        f"at        {at}",
        f"operator  {m.operator}",
        f"change    {m.description}",
    ]
    return "\n".join(head) + "\n\n" + m.diff
