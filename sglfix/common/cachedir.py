"""Where sglfix keeps what it can make again: one folder, and each cache's place in it.

The folder is ``SGLFIX_CACHE``, else ``~/.cache/sglfix``. In it: the result store (``results/``,
unless ``SGLFIX_STORE`` names another folder), the releases fetched (``releases/``), the Triton
key memo (``triton-key/``), the installed files' digests (``file-digests.sqlite``), the code base files'
parses (``parsed-digests.sqlite``) and the start-up
hook's cache of toggle directories (``arm-*.json``; ``SGLFIX_CACHE_DIR`` names another folder for
it). A leaf like ``sglfix.common.environ``: the start-up hook asks it for its folder.
"""

from __future__ import annotations

import os

from sglfix.common.environ import envs

__all__ = ["arm", "file_digests", "parsed_digests", "releases", "results", "root", "triton_key"]


def root() -> str:
    """The folder of every cache: ``SGLFIX_CACHE``, else ``~/.cache/sglfix``."""
    return os.path.expanduser(envs.SGLFIX_CACHE.get() or os.path.join("~", ".cache", "sglfix"))


def results() -> str:
    """The result store's folder: ``SGLFIX_STORE`` when it names one, else ``results/``."""
    return envs.SGLFIX_STORE.get() or os.path.join(root(), "results")


def releases() -> str:
    """The folder holding one folder per release fetched."""
    return os.path.join(root(), "releases")


def triton_key() -> str:
    """The folder of the Triton key memo, one file per Triton install."""
    return os.path.join(root(), "triton-key")


def file_digests() -> str:
    """The file of the installed files' digests."""
    return os.path.join(root(), "file-digests.sqlite")


def parsed_digests() -> str:
    """The file of the code base files' function and skeleton digests, by content."""
    return os.path.join(root(), "parsed-digests.sqlite")


def arm() -> str:
    """The start-up hook's folder: ``SGLFIX_CACHE_DIR``, else the cache folder. Without
    ``SGLFIX_CACHE``, ``$XDG_CACHE_HOME/sglfix`` where that is set, as it always was for this
    cache (its entries check themselves, so a move costs one rebuild, never a wrong answer)."""
    folder = envs.SGLFIX_CACHE_DIR.get()
    if folder:
        return folder
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and not envs.SGLFIX_CACHE.get():
        return os.path.join(xdg, "sglfix")
    return root()
