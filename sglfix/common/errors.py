"""Exception types: which failures are the user's input (exit 2) and which are checks (exit 1)."""

from __future__ import annotations


class SglfixError(Exception):
    """Base class. The first line of the message is what the CLI prints."""

    exit_code = 2


class ConfigError(SglfixError, ValueError):
    """A YAML file, scenario file, env value or option is malformed."""


class TargetError(SglfixError, LookupError):
    """A patch target cannot be resolved or is of a kind that cannot be patched."""


class PatchApplicationError(SglfixError):
    """A ``match`` block is not found, or found more than once, in the target source.

    Named as in sglang's source_patcher so that callers catching it keep working.
    """

    exit_code = 1


class PatchStateError(SglfixError):
    """Applying or restoring out of order: a revert applied twice, a non-LIFO restore."""
