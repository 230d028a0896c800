"""Reading a fix's unified diff (``toggle from-diff``): its header (``git format-patch``, ``git
show``, a commit read from git), its files through unidiff, and each hunk's runs of changed lines
placed in the installed (post-fix) file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sglfix.common.errors import ConfigError

__all__ = [
    "DIFF_WANTED",
    "MAX_DIFF_BYTES",
    "Change",
    "PatchHeader",
    "commit_header",
    "hunk_changes",
    "hunk_name",
    "locate_hunk",
    "parse_diff",
]

MAX_DIFF_BYTES = 4 * 1024 * 1024
# What a refusal of a file that is not a diff asks for instead.
DIFF_WANTED = "a unified diff as text (the output of git show, git format-patch or diff -u)"
_URL_RE = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/pull/\d+")


@dataclass
class PatchHeader:
    title: str = ""
    description: str = ""
    url: str = ""
    commit: str = ""


@dataclass
class Change:
    """One run of changed lines of a hunk: ``post`` the fix's lines, ``pre`` the lines before it;
    ``at`` the 0-based index in the post-fix file where ``post`` starts (or would, when empty)."""

    at: int
    post: list[str]
    pre: list[str]
    hunk: str  # "path @@ -a,b +c,d @@", for messages


def parse_diff(text: str, *, where: str) -> tuple[PatchHeader, Any]:
    """The header (``git format-patch`` / ``git show`` / none) and the files of a unified diff."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    if not text.strip():
        raise ConfigError(
            f"{where} is empty; give the fix's diff (the output of git show, git format-patch or diff -u)"
        )
    try:
        files = PatchSet(text)
    except UnidiffParseError as exc:
        raise ConfigError(
            f"{where} is not a unified diff that parses ({exc}); give the output of git show, "
            f"git format-patch or diff -u"
        ) from None
    if not len(files):
        raise ConfigError(
            f"{where} is not a unified diff (no ---/+++ file headers); give the output of git show, "
            f"git format-patch or diff -u"
        )
    return _header(text), files


def _header(text: str) -> PatchHeader:
    head = re.split(r"^(?:diff --git |--- )", text, maxsplit=1, flags=re.M)[0]
    header = PatchHeader()
    m = re.search(r"^commit ([0-9a-f]{7,40})", head, re.M) or re.search(r"^From ([0-9a-f]{40}) ", head, re.M)
    if m:
        header.commit = m.group(1)
    m = re.search(r"^Subject: (?:\[[^\]]*\]\s*)?(.+(?:\n [^\n]+)*)", head, re.M)
    if m:  # format-patch: the subject may be folded over several lines
        header.title = " ".join(part.strip() for part in m.group(1).splitlines())
        body = head[m.end() :]
    else:  # git show: the message is indented by four spaces after the Date line
        message = [line[4:] for line in head.splitlines() if line.startswith("    ")]
        header.title = message[0].strip() if message else ""
        body = "\n".join(message[1:])
    body = body.split("\n---\n", 1)[0]  # format-patch's diffstat follows the message
    header.description = "\n".join(line.rstrip() for line in body.strip().splitlines()).strip()
    m = _URL_RE.search(head)
    if m:
        header.url = m.group(0)
    return header


def commit_header(commit: str, subject: str, body: str) -> PatchHeader:
    """The header of a commit read from git (``%H``, ``%s``, ``%b``) rather than from a patch's
    mail header: the title is the subject, as ``format-patch`` would give it less its ``[PATCH]``."""
    description = "\n".join(line.rstrip() for line in body.strip().splitlines()).strip()
    m = _URL_RE.search(subject + "\n" + body)
    return PatchHeader(title=subject.strip(), description=description, url=m.group(0) if m else "", commit=commit)


def hunk_name(path: str, hunk: Any) -> str:
    """A hunk as messages name it: ``<path> @@ -a,b +c,d @@``."""
    return f"{path} @@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@"


def locate_hunk(hunk: Any, post: list[str]) -> int | None:
    """Where the hunk's post-fix side (context and added lines) starts in the installed file: at
    the line it names, else the one place it occurs (a diff made against a slightly older tree)."""
    target = [line.value.rstrip("\n") for line in hunk if not line.is_removed]
    if not target:
        return None
    n = len(target)
    stated = hunk.target_start - 1
    if post[stated : stated + n] == target:
        return stated
    hits = [i for i in range(len(post) - n + 1) if post[i : i + n] == target]
    return hits[0] if len(hits) == 1 else None


def hunk_changes(hunk: Any, start: int, name: str) -> list[Change]:
    """The runs of removed/added lines of a hunk, placed in the installed file."""
    out: list[Change] = []
    at = start
    current: Change | None = None
    for line in hunk:
        value = line.value.rstrip("\n")
        if line.is_context:
            current = None
            at += 1
            continue
        if current is None:
            current = Change(at=at, post=[], pre=[], hunk=name)
            out.append(current)
        if line.is_added:
            current.post.append(value)
            at += 1
        elif line.is_removed:
            current.pre.append(value)
    return out
