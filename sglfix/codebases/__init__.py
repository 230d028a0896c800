"""Code bases the harness replays scenarios through, one record per version (``records``).

A profile's record (``Profile``, read from its folder's ``profile.toml``) names its code base: the
reproduction (``sglfix.backends``, part of sglfix and always there) or an engine distribution in a
range of versions, found without importing it (the CLI parent never imports the engine) and
refused in one line when it is missing or of a version the range does not cover.

Which code base a process replays through is process state: a worker activates one at boot
(``activate``) and everything that asks "is this frame the code under test?", "which adapter
runs backend X?" reads ``active()``. Imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

from sglfix.codebases.installed import Installed, installed
from sglfix.codebases.records import (
    CODEBASES,
    PROFILE_FILE,
    PROFILES_PATH_ENV,
    REPRODUCTION_NAME,
    CodeBase,
    Profile,
    get_codebase,
    profiles,
    search_folders,
)
from sglfix.common.codebase import active_codebase, set_active
from sglfix.common.errors import ConfigError

__all__ = [
    "CODEBASES",
    "PROFILES_PATH_ENV",
    "PROFILE_FILE",
    "REPRODUCTION",
    "REPRODUCTION_NAME",
    "CodeBase",
    "Installed",
    "Profile",
    "activate",
    "active",
    "check_engine_flags",
    "check_given_version",
    "check_installed",
    "check_interpreter",
    "check_scenarios_runnable",
    "get_codebase",
    "installed",
    "profiles",
    "search_folders",
]


def __getattr__(name: str) -> Any:
    # REPRODUCTION, and SGLANG_0_5_23-style names of the other records, are read on first use:
    # importing this module reads no file.
    if not name.isupper() or name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "REPRODUCTION":
        return get_codebase(REPRODUCTION_NAME)
    for record in profiles().values():
        if record.name.upper().replace("-", "_").replace(".", "_") == name:
            return record
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- the active one


def active() -> Profile:
    """The code base this process replays through (the reproduction unless a worker chose another)."""
    cb = active_codebase()
    return cb if cb is not None else get_codebase(REPRODUCTION_NAME)


def activate(codebase: Profile | str) -> list[str]:
    """Make ``codebase`` this process's code under test; install its stand-ins where the packages
    are missing. Returns the stand-ins in use. Call before the code base is imported."""
    cb = get_codebase(codebase) if isinstance(codebase, str) else codebase
    set_active(cb)
    if not cb.standins:
        return []
    from sglfix.codebases import standins

    return standins.install(cb.standins, equivalents=cb.standin_equivalents)


def check_installed(cb: CodeBase, *, what: str) -> Installed:
    """The installed code base, or a one-line ConfigError naming both versions and the fix."""
    found = installed(cb)
    if found is None:
        raise ConfigError(
            f"{what} replays through {cb.package} {cb.version}, but {cb.package} is not importable "
            f"here; install it: {cb.install_hint}"
        )
    if cb.is_reproduction:
        return found
    from sglfix.codebases.records import unknown_version

    if not found.known:
        raise ConfigError(unknown_version(found, what=what))
    check_given_version(found)
    if not cb.covers(found.version) and cb.beyond != found.version:
        written = f"{cb.version}" + (f" ({cb.versions})" if cb.versions else "")
        others = [
            p.name
            for p in profiles().values()
            if p.package == cb.package and p.distribution and p.covers(found.version)
        ]
        pick = f"pick profile {others[0]}" if others else f"pick the profile of {found.version}"
        raise ConfigError(
            f"{what} is written for {cb.package} {written}, but {cb.package} {found.version} is "
            f"installed ({found.path}); install {cb.distribution}=={cb.version} or {pick}"
        )
    return found


def check_given_version(found: Installed) -> None:
    """``--codebase-version V`` names the version of a source tree that does not record its own;
    where a build recorded another, the option would be a false statement: one line."""
    from sglfix.common.environ import envs

    given = envs.SGLFIX_CODEBASE_VERSION.get() or ""
    if given and found.read_from == "build" and given != found.version:
        raise ConfigError(
            f"--codebase-version {given}: {found.distribution} at {found.path} records its version, "
            f"{found.version} (its build wrote it); drop --codebase-version"
        )


def _release(version: str) -> tuple[int, ...]:
    out = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if digits != piece:
            break
    return tuple(out)


def check_interpreter(cb: CodeBase, *, what: str) -> None:
    """One-line ConfigError when a CPU run of ``cb`` would meet a triton interpreter too old for
    its kernels (read from the installed metadata; triton is not imported)."""
    if cb.interpreter_triton is None:
        return
    from importlib import metadata

    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        version = None
    if version is None or _release(version) < _release(cb.interpreter_triton):
        raise ConfigError(
            f"{what} on CPU runs {cb.name}'s Triton kernels under the interpreter, which needs "
            f"triton >= {cb.interpreter_triton} (installed: {version or 'none'}); "
            f"pip install 'triton>={cb.interpreter_triton}', or run with --device cuda"
        )


def check_scenarios_runnable(scenarios, cb: CodeBase) -> None:
    """One-line ConfigError for the first scenario ``cb`` cannot run (a mode it lacks, a backend it
    has no adapter for, a probe it does not have), before any cell runs."""
    for s in scenarios:
        backend = getattr(s, "backend", None)
        probe = getattr(s, "probe", None)
        where = f"{getattr(s, 'path', '?')}:{getattr(s, 'line', '?')}: scenario {s.name!r}"
        if probe is not None and probe not in cb.probes:
            others = [c.name for c in CODEBASES.values() if probe in c.probes]
            raise ConfigError(
                f"{where}: probe {probe} does not exist on {cb.name} (has: "
                f"{', '.join(sorted(cb.probes)) or 'no probes'}); "
                + (
                    f"it runs on {' and '.join(others)} (pick the profile that replays through it)"
                    if others
                    else "drop the scenario"
                )
            )
        if s.mode in cb.lacks_modes:
            raise ConfigError(f"{where}: mode {s.mode} cannot run on {cb.name}: {cb.lacks_modes[s.mode]}")
        runs = cb.backend_modes.get(backend) if backend is not None else None
        if runs is not None and s.mode not in runs:
            others = [c.name for c in CODEBASES.values() if s.mode in c.backend_modes.get(backend, (s.mode,))]
            raise ConfigError(
                f"{where}: backend {backend} on {cb.name} runs {', '.join(runs)}, not {s.mode}"
                + (f"; it runs on {' and '.join(others)} (pick that profile)" if others else "")
            )
        # Keys only some backends' adapters hand on: (given, the profile's list, key, what is lacking).
        read_by = (
            (
                getattr(getattr(s, "model", None), "sliding_window", None) is not None,
                "sliding_window",
                "model.sliding_window",
                "has no sliding-window layer",
            ),
            (
                bool(getattr(s, "deterministic", False)),
                "deterministic",
                "deterministic",
                "has no deterministic-inference path here",
            ),
            (bool(getattr(s, "mamba_track", None)), "mamba_track", "batch.mamba_track", "tracks no Mamba state here"),
            (
                getattr(getattr(s, "model", None), "linear_attention", None) is not None,
                "linear_attention",
                "model.linear_attention",
                "has no linear-attention layers",
            ),
            (
                getattr(s, "encoder_lens", None) is not None,
                "encoder_decoder",
                "batch.encoder_lens",
                "has no encoder-decoder (cross-attention) path here",
            ),
            (
                getattr(s, "items", None) is not None,
                "multi_item_scoring",
                "batch.items",
                "has no multi-item scoring path here",
            ),
            (
                getattr(getattr(s, "model", None), "mha_chunk", None) is not None,
                "mha_prefill",
                "model.mha_chunk",
                "has no MLA multi-head prefill path here",
            ),
            (
                getattr(s, "mode", None) == "TARGET_VERIFY" and getattr(s, "accept_lens", None) is not None,
                "verify_commit",
                "batch.accept_lens",
                "runs no commit after a verify here",
            ),
            (
                getattr(s, "dcp_size", 1) > 1 and getattr(s, "probe", None) is None,
                "decode_context_parallel",
                "dcp_size",
                "builds no decode context-parallel metadata here",
            ),
        )
        for given, field, key, lacks in read_by:
            if given:
                _refuse_unless_read(cb, backend, field, where=where, key=key, lacks=lacks)
        if backend is not None and backend not in cb.adapters:
            raise ConfigError(
                f"{where}: backend {backend} has no adapter on {cb.name} (has: "
                f"{', '.join(sorted(cb.adapters))}); drop the scenario or pick another profile"
            )
        if getattr(s, "env", None):
            check_engine_flags(s.env, cb, where=where)


def _refuse_unless_read(cb: CodeBase, backend: Any, field: str, *, where: str, key: str, lacks: str) -> None:
    """A scenario key only some backends' adapters hand on (the profile's ``field`` lists them):
    one line where this one does not, naming the profiles whose backend does."""
    if backend in getattr(cb, field):
        return
    others = [c.name for c in CODEBASES.values() if backend in getattr(c, field)]
    raise ConfigError(
        f"{where}: {key}: backend {backend} on {cb.name} {lacks}"
        + (f"; it runs on {' and '.join(others)} (pick that profile)" if others else "; drop the key")
    )


def check_engine_flags(env: dict, cb: CodeBase, *, where: str) -> None:
    """A scenario's ``env:`` against the flags the installed code base declares, where it is the
    profile's own version: another release (``--release``, a version the profile also covers) may
    lack a flag the profile's has, which its cells then report as a path that release does not
    have (SKIP), not as a mistake in the scenario."""
    import os

    from sglfix.codebases.engine_flags import check_env

    if not cb.engine_flags:
        raise ConfigError(
            f"{where}: env: {cb.name} reads no engine flags; drop the key (or pick a real-sglang profile)"
        )
    found = installed(cb)
    if found is None or found.version != cb.version:
        return
    if not os.path.isfile(os.path.join(found.path, cb.engine_flags.partition(":")[0])):
        return  # a tree without the flags' module: its cells say what they cannot switch
    check_env(env, root=found.path, source=cb.engine_flags, where=where, what=f"{cb.package} {found.version}")
