"""Profile folders (installed as ``sglfix.profiles``): each subfolder holding a ``profile.toml`` is
one profile, found by listing this folder (``sglfix.codebases.search_folders``).

``reproduction/`` describes the built-in reproduction (its toggle and scenario files are the
``sglfix.toggles`` and ``sglfix.scenarios`` packages); every other folder holds a real code base's
toggle files beside its record, its scenarios and its known divergences.
"""
