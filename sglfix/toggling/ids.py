"""Toggle ids, the one grammar every reader of an id uses: ``27460`` (every part of PR 27460)
or ``27460:sizing`` (one part). The registry, ``REVERT_PR``, the command line and
a toggle file's ``expect[].revert`` all parse through ``ToggleId.parse``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeGuard

from sglfix.common.errors import ConfigError

__all__ = ["CANDIDATE_PREFIX", "EXAMPLE", "MAX_PR", "PART_NAME_RE", "ToggleId", "is_candidate_id"]

# A PR number has no leading zero (so `011` and `11` cannot both name one toggle) and at most
# nine digits; a part name is what a YAML key and a shell argument carry without quoting.
PART_NAME_RE = re.compile(r"[a-z][a-z0-9_-]*", re.ASCII)
_ID_RE = re.compile(r"([1-9][0-9]{0,8})(?::(" + PART_NAME_RE.pattern + r"))?", re.ASCII)
MAX_PR = 999_999_999
EXAMPLE = "27460 or 27460:sizing"
# A candidate fix (--apply, sglfix.toggling.candidate) in a toggle set: ``+`` and the file's name.
CANDIDATE_PREFIX = "+"


def is_candidate_id(token: object) -> TypeGuard[str]:
    return isinstance(token, str) and token.startswith(CANDIDATE_PREFIX)


@dataclass(frozen=True, order=True)
class ToggleId:
    """A PR number, and the name of one of its parts or None for every part."""

    pr: int
    part: str | None = None

    @classmethod
    def parse(cls, text: str | int | ToggleId, *, what: str = "toggle id") -> ToggleId:
        """``text`` as an id, or a one-line ConfigError that starts with ``what``."""
        if isinstance(text, ToggleId):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            text = str(text)
        if not isinstance(text, str):
            raise ConfigError(f"{what}: {text!r} is not a toggle id like {EXAMPLE}")
        stripped = text.strip()
        if not stripped:
            raise ConfigError(f"{what}: empty toggle id; give one like {EXAMPLE}")
        match = _ID_RE.fullmatch(stripped)
        if match is None:
            raise ConfigError(f"{what}: {_show(stripped)} is not a toggle id like {EXAMPLE}")
        return cls(int(match.group(1)), match.group(2))

    @classmethod
    def parse_list(cls, values: str | Iterable[str], *, what: str) -> list[ToggleId]:
        """Ids from comma lists (``-r 26651,27460:sizing -r 26738``); an empty item is an error,
        never "nothing", so that ``-r ''`` cannot pass for a run with nothing reverted."""
        items = [values] if isinstance(values, str) else list(values)
        if not items:
            return []
        return [cls.parse(token, what=what) for value in items for token in str(value).split(",")]

    @property
    def whole(self) -> bool:
        return self.part is None

    def __str__(self) -> str:
        return str(self.pr) if self.part is None else f"{self.pr}:{self.part}"


def _show(token: str, limit: int = 40) -> str:
    return repr(token if len(token) <= limit else token[:limit] + "...")
