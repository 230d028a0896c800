"""sglfix's version, in a leaf that any layer may read (the start-up hook's cache keys on it)."""

__version__ = "0.1.0"
