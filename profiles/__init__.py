"""Toggle profiles for code bases other than the reproduction (installed as ``sglfix.profiles``).

Each subdirectory is one profile's toggle files; ``sglfix.toggling.profiles`` names them.
"""
