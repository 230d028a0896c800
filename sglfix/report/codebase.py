"""The code base a report's cells replayed through, as a report records it: in words for headers,
and as (name, version) for comparing two reports. Part of the one judgement's API
(``sglfix.report.outcome``); imports nothing of sglfix."""

from __future__ import annotations

__all__ = ["codebase_identity", "codebase_label"]


def codebase_label(report: dict) -> str:
    """The code base a report's cells replayed through, in words: ``sglang X.Y.Z at PATH
    (stand-ins: sgl_kernel)`` or ``built-in reproduction``; ``code base not recorded`` for a
    report written before it was."""
    cb = report.get("codebase")
    if not isinstance(cb, dict):
        return "code base not recorded"
    if cb.get("name") == "reproduction":
        return "built-in reproduction"
    text = f"{cb.get('distribution') or cb.get('name')} {cb.get('version') or '?'}"
    if cb.get("path"):
        text += f" at {cb['path']}"
    beyond = ", newer than its range: toggles that no longer apply are findings" if cb.get("beyond_range") else ""
    if cb.get("release"):
        text += f" (profile {cb['name']}, --release {cb['release']} from sglfix's cache{beyond})"
    elif cb.get("followed"):
        text += f" (profile {cb['name']}, following the installed {cb['followed']}{beyond})"
    if cb.get("standins"):
        text += f" (stand-ins: {', '.join(cb['standins'])})"
    return text


def codebase_identity(report: dict) -> tuple[str, str] | None:
    """(name, version) of the code base, None when the report does not record it."""
    cb = report.get("codebase")
    if not isinstance(cb, dict):
        return None
    return str(cb.get("name")), str(cb.get("version"))
