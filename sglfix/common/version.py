"""sglfix's version, in a leaf that any layer may read (the start-up hook's cache keys on it), and
the source it runs from (``source``): the git commit a report records and a finding's install line
names, so that someone without sglfix installs exactly the code that wrote it.

The commit is read from git when sglfix runs from a checkout (an editable install, ``PYTHONPATH``);
a regular wheel carries the commit of the tree it was built from (``BUILD_FILE``, written by
setup.py), and pip's own record of a ``pip install git+URL@COMMIT`` (PEP 610) gives the address.
Nothing here runs at import: the start-up hook imports this module in every process.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["BUILD_FILE", "__version__", "git_source", "public_url", "source"]

# Beside this package's __init__.py in a regular wheel: {"commit", "modified", "url"} of the tree built.
BUILD_FILE = "_source.json"
# The files of a checkout that make what sglfix does (what a wheel ships): a change elsewhere
# (tests, bench, the findings a profile keeps) leaves the commit an exact account of the code that ran.
SHIPPED = (
    "sglfix",
    "backends",
    "toggles",
    "scenarios",
    "profiles",
    ":(exclude)profiles/*/findings/*",
    "pyproject.toml",
    "setup.py",
)

_SOURCE: dict | None = None


def source() -> dict:
    """``{"version", "commit", "modified", "url"}`` of the sglfix running here: ``commit`` the
    full git hash (None where it cannot be known), ``modified`` how many of the shipped files
    differ from it (None: unknown), ``url`` a public address of its repository (None: none
    recorded). Read once per process."""
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = {"version": __version__, **_find()}
    return dict(_SOURCE)


def _find() -> dict:
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)
    if _is_checkout(root):
        return git_source(root)
    found = {"commit": None, "modified": None, "url": None}
    built = _read_json(os.path.join(package, BUILD_FILE))
    if isinstance(built, dict):
        found.update({k: built.get(k) for k in found})
    pip = _pip_record()
    if pip is not None:
        # pip's record names what it installed; the build's, the tree it built (the same commit).
        found["commit"] = found["commit"] or pip.get("commit")
        found["url"] = pip.get("url") or found["url"]
        if found["modified"] is None and pip.get("commit"):
            found["modified"] = 0  # pip checked out that commit itself
    return found


def _is_checkout(root: str) -> bool:
    import os

    marker = os.path.join(root, "pyproject.toml")
    if not os.path.exists(os.path.join(root, ".git")) or not os.path.isfile(marker):
        return False
    with open(marker, encoding="utf-8") as fh:
        return 'name = "sglfix"' in fh.read()


def git_source(root: str) -> dict:
    """The commit of the checkout at ``root``, how many shipped files differ from it (tracked
    and new), and its ``origin`` as a public address (None where there is none); None values
    where git cannot tell. setup.py calls this when it builds a wheel."""
    import os

    unknown = {"commit": None, "modified": None, "url": None}
    top = _git(root, "rev-parse", "--show-toplevel")
    # A tree inside another repository (vendored) is not that repository's commit.
    if top is None or not os.path.isdir(top.strip()) or not os.path.samefile(top.strip(), root):
        return unknown
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if head is None or len(head.strip()) != 40:
        return unknown
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", *SHIPPED)
    origin = _git(root, "config", "--get", "remote.origin.url")
    return {
        "commit": head.strip(),
        "modified": None if status is None else len([line for line in status.splitlines() if line.strip()]),
        "url": public_url(origin.strip()) if origin else None,
    }


def _git(root: str, *args: str) -> str | None:
    import subprocess

    try:
        # No optional locks: reading the status must never take the index lock a commit needs.
        proc = subprocess.run(
            ["git", "--no-optional-locks", "-C", root, *args],
            capture_output=True,
            text=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def public_url(url: str) -> str | None:
    """``url`` as an address anyone may clone (``https://host/path``, credentials dropped), or
    None for a local path or a ``file:`` address (a machine's own folder is no address)."""
    import re
    from urllib.parse import urlsplit, urlunsplit

    url = url.strip().removeprefix("git+")
    scp = re.fullmatch(r"[\w.-]+@([\w.-]+):(?!//)(.+)", url)
    if scp:
        return f"https://{scp.group(1)}/{scp.group(2).lstrip('/')}"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "ssh", "git") or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port and parts.scheme in ("https", "http") else "")
    return urlunsplit(("https" if parts.scheme in ("ssh", "git") else parts.scheme, host, parts.path, "", ""))


def _read_json(path: str) -> object:
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _pip_record() -> dict | None:
    """The commit and address pip recorded when it installed sglfix from a git repository."""
    import json
    from importlib import metadata

    try:
        text = metadata.distribution("sglfix").read_text("direct_url.json")
        data = json.loads(text) if text else None
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    vcs = data.get("vcs_info") if isinstance(data, dict) else None
    if not isinstance(vcs, dict) or vcs.get("vcs") != "git":
        return None
    commit = vcs.get("commit_id")
    return {
        "commit": commit if isinstance(commit, str) else None,
        "url": public_url(data["url"]) if isinstance(data.get("url"), str) else None,
    }
