"""The ``sglfix`` command line: one module per command, shared options through the context."""

from sglfix.cli.app import main

__all__ = ["main"]
