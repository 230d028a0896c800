"""The profile record and where records are found: one ``profile.toml`` per profile folder.

A profile folder describes itself in one file, ``profile.toml`` (``Profile``): its toggle files,
scenarios and known divergences, and its code base: the reproduction (``sglfix.backends``, part of
sglfix) or an engine distribution in a range of versions. Profiles are found by listing folders
(``search_folders``): the built-in ``sglfix.profiles`` (``profiles/`` of a checkout), then every
folder ``SGLFIX_PROFILES_PATH`` names; each folder there holding ``profile.toml`` (and a named
folder itself, if it holds one) is a profile. Nothing lists them by hand.

Imports nothing heavy: the start-up hook reads the records with tomllib and the dataclass's own
constructor; ``profiles(checked=True)`` validates every file with pydantic as well.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError

__all__ = [
    "CODEBASES",
    "PROFILES_PATH_ENV",
    "PROFILE_FILE",
    "REPRODUCTION_NAME",
    "CodeBase",
    "Profile",
    "engine_version",
    "get_codebase",
    "profiles",
    "search_folders",
]

PROFILE_FILE = "profile.toml"
PROFILES_PATH_ENV = envs.SGLFIX_PROFILES_PATH.name
REPRODUCTION_NAME = "reproduction"
_PACKAGE_PREFIX = "package:"


@dataclass(frozen=True, eq=False, repr=False)
class Profile:
    """A profile and the code base it is written for, as its ``profile.toml`` says.

    Paths (``toggles``, ``scenarios``, ``known``) are relative to the file's folder, or
    ``package:NAME`` for the folder of an installed package (the reproduction's files are
    packages of sglfix). The record is a plain dataclass so that the start-up hook can build it
    without pydantic; pydantic validates the same fields (``profiles(checked=True)``)."""

    __pydantic_config__: ClassVar[dict] = {"extra": "forbid"}

    name: str
    package: str  # the top-level package whose modules are the code under test
    summary: str  # the profile, in words
    code_summary: str = ""  # its code base, in words
    toggles: str = "."
    scenarios: str = "scenarios"
    # A list of confirmed upstream divergences the gate accepts (sglfix.execution.known), if any.
    known: str | None = None
    distribution: str | None = None  # None: the reproduction, shipped inside sglfix
    version: str | None = None  # the version the profile is written for (messages, install pins)
    versions: str | None = None  # the versions it covers, PEP 440 specifiers (default: ==version)
    # How to install it, for the one-line refusal.
    install_hint: str = ""
    # The engine's own reader of REVERT_PR. While sglfix applies the variable in a
    # process, that function must neither apply its own (possibly dead) reverts again nor choke
    # on a comma list: its code is replaced, so callers that bound it by name get the new code.
    engine_toggle: str | None = None
    # The package holding every use of the engine's private attention test kit, and everything else
    # copied from this one version (sglfix.harness.kits; its KIT_MODULES are preloaded too);
    # None: the code base has no kit.
    kit: str | None = None
    # backend name -> module defining ``ADAPTER`` for this code base
    adapters: dict[str, str] = field(default_factory=dict)
    # probe name (sglfix.scenario.modes.PROBE_RULES) -> module defining ``PROBE`` for this code base
    probes: dict[str, str] = field(default_factory=dict)
    # Forward modes the scenario format has and this code base does not (refused before any cell).
    lacks_modes: dict[str, str] = field(default_factory=dict)
    # Backends whose adapter builds a sliding-window layer (the scenario's model.sliding_window).
    sliding_window: tuple[str, ...] = ()
    # Backends whose adapter publishes deterministic inference to the backend (``deterministic``).
    deterministic: tuple[str, ...] = ()
    # Backends whose adapter hands a prefill's Mamba state tracking to the backend (``batch.mamba_track``).
    mamba_track: tuple[str, ...] = ()
    # Backends whose adapter builds the linear-attention layer set a scenario names
    # (``model.linear_attention``: a hybrid model's gated delta net or Mamba2 mixer).
    linear_attention: tuple[str, ...] = ()
    # Backends whose adapter builds an encoder-decoder batch and its cross-attention layer
    # (``batch.encoder_lens``, ``model.cross_attention``).
    encoder_decoder: tuple[str, ...] = ()
    # Backends whose adapter builds a multi-item scoring batch (``batch.items``: sglang's
    # --enable-mis, delimiter indices per request).
    multi_item_scoring: tuple[str, ...] = ()
    # Backends that run an MLA model's multi-head prefill through their chunk runner
    # (``model.mha_chunk``).
    mha_prefill: tuple[str, ...] = ()
    # Backends whose adapter runs the worker's commit after a verify (a TARGET_VERIFY's
    # ``batch.accept_lens``: each request's state at its last accepted step made its own).
    verify_commit: tuple[str, ...] = ()
    # Backends whose adapter builds every rank's metadata of a decode context-parallel batch
    # (a scenario's ``dcp_size`` > 1).
    decode_context_parallel: tuple[str, ...] = ()
    # Where the code base declares its engine flags, ``path.py:Class`` in its package (a scenario's
    # ``env:`` is checked against them); "" where it has none (the reproduction).
    engine_flags: str = ""
    # backend -> boolean engine flags ``sglfix search`` may turn on in its drawn scenarios (one at a
    # time, now and then): paths of the backend that run only under a flag (a host-side plan) are in
    # the space as well. Each is checked against ``engine_flags`` as a scenario's ``env:`` is.
    search_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # backend -> a flag of its ``search_flags`` -> the modes the flag makes free of device->host
    # syncs (a host-side plan's flag: the plan reads host mirrors only). A drawn scenario turning
    # the flag on in one of them is declared ``sync_free: cuda`` (only CUDA can tell a mirror's
    # read from a device read).
    sync_free_flags: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    # Survivors of sglfix mutate a person read and found equivalent (a YAML file in the profile's
    # folder, sglfix.mutation.reviewed): reported equivalent (reviewed), never survived.
    equivalent_mutants: str = ""
    # backend -> the modes its adapter runs here, where fewer than the scenario format's table
    # (sglfix.scenario.modes.BACKEND_RULES) allows; a backend not named runs all of those.
    backend_modes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Packages the code base imports at module level that a CPU machine cannot install.
    standins: tuple[str, ...] = ()
    # Packages the engine cannot be imported beside in another version than its metadata pins
    # with == (sglfix.codebases.pins); its other pins a CPU set-up may miss harmlessly.
    import_pins: tuple[str, ...] = ()
    # Capability queries of a stood-in package that the code base implements itself
    # (stand-in path -> "module:function"); see sglfix.codebases.standins.
    standin_equivalents: dict[str, str] = field(default_factory=dict)
    # Modules a worker imports at boot (an installed engine is far larger than what the harness
    # drives; the reproduction is imported whole): every module a toggle of the profile targets
    # or an adapter drives, so the worker's state snapshot covers them.
    preload: tuple[str, ...] = ()
    # The oldest triton whose interpreter runs this code base's kernels on CPU (None: any). Checked
    # before a CPU run, not pinned in an extra: a CUDA torch pins its own triton, and on a GPU the
    # kernels are compiled, not interpreted.
    interpreter_triton: str | None = None
    # Where the package's files sit in the code base's own repository, as a fix's diff names them
    # (``sglfix toggle from-diff``): backends/... for the reproduction, python/sglang/... for sglang.
    repo_prefix: str = ""
    # The attention-metadata surface ``sglfix mutate`` changes (globs over dotted function names,
    # ``*`` crossing dots): forward-metadata builders, graph capture/replay buffer updates,
    # speculative input builders, sizing functions, the index kernels' callers; ``mutate_exclude``
    # takes out what they catch that computes attention rather than its metadata.
    mutate_surface: tuple[str, ...] = ()
    mutate_exclude: tuple[str, ...] = ()
    # The folder the record was read from (not a key of the file).
    folder: str = field(default="", init=False, repr=False)
    # Set when the record was chosen by following what is installed (``--profile sglang``, not a
    # key of the file): the name asked for, which workers resolve again, and the installed version
    # newer than the record's range that it was stretched to (None: the range covers it).
    asked: str = field(default="", init=False, repr=False)
    beyond: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # TOML has arrays, not tuples; pydantic converts them itself.
        for name in ("standins", "preload", "import_pins", "mutate_surface", "mutate_exclude"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def __repr__(self) -> str:
        return f"Profile({self.name!r}, folder={self.folder!r})"

    @property
    def is_reproduction(self) -> bool:
        return self.distribution is None

    @property
    def label(self) -> str:
        """The code base in words: distribution and version (``sglang X.Y.Z``), or ``the reproduction``."""
        return "the reproduction" if self.is_reproduction else f"{self.distribution} {self.version}"

    @property
    def codebase(self) -> str:
        """The code base's name (a profile is its own code base)."""
        return self.name

    @property
    def source(self) -> str:
        """What ``pip download`` fetches to check the toggles against (empty: the reproduction)."""
        return "" if self.is_reproduction else f"{self.distribution}=={self.version}"

    @property
    def toggles_dir(self) -> str:
        return self._place(self.toggles)

    @property
    def scenarios_dir(self) -> str:
        return self._place(self.scenarios)

    @property
    def known_file(self) -> str | None:
        return None if self.known is None else self._place(self.known)

    def covers(self, version: str) -> bool:
        """Whether this profile is written for ``version`` of its distribution."""
        if self.versions is None:
            return version == self.version
        return version in _specifiers(self.versions, where=self.name)

    def _place(self, where: str) -> str:
        if where.startswith(_PACKAGE_PREFIX):
            from sglfix.common.codebase import package_dir

            package, _, sub = where[len(_PACKAGE_PREFIX) :].partition("/")
            root = package_dir(package)
            if root is None:
                raise ConfigError(f"profile {self.name}: {where}: no package {package} is importable here")
            return os.path.join(root, sub) if sub else root
        return os.path.normpath(os.path.join(self.folder or os.getcwd(), where))

    def _check(self, *, path: str) -> None:
        """What the field types cannot say, worded for the file's author."""
        folder = os.path.basename(os.path.dirname(path))
        if self.name != folder:
            raise ConfigError(f"{path}: name {self.name!r} is not its folder's name {folder!r}; make them agree")
        if self.is_reproduction:
            extra = [k for k in ("version", "versions", "kit", "install_hint") if getattr(self, k)]
            if extra:
                raise ConfigError(f"{path}: {', '.join(extra)} need a distribution (the code base of an engine)")
            return
        if not self.version:
            raise ConfigError(f"{path}: distribution {self.distribution} needs the version it is written for")
        if self.versions is not None and not self.covers(self.version):
            raise ConfigError(f"{path}: versions {self.versions!r} does not cover version {self.version}")


CodeBase = Profile  # what a profile's scenarios replay through: the same record


def _specifiers(text: str, *, where: str) -> Any:
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:
        raise ConfigError(
            f"profile {where}: reading its versions range ({text}) needs packaging; pip install packaging"
        ) from None
    try:
        return SpecifierSet(text, prereleases=True)
    except InvalidSpecifier as exc:
        raise ConfigError(f"profile {where}: versions {text!r} is not a version range ({exc})") from None


# ----------------------------------------------------------------------------- discovery


def search_folders() -> list[str]:
    """Where profiles are looked for, in order: the built-in ``sglfix.profiles``, then every
    folder ``SGLFIX_PROFILES_PATH`` names (``os.pathsep``-separated)."""
    from sglfix.common.codebase import package_dir

    builtin = package_dir("sglfix.profiles")
    folders = [builtin] if builtin else []
    for entry in (envs.SGLFIX_PROFILES_PATH.get() or "").split(os.pathsep):
        if not entry.strip():
            continue
        path = os.path.abspath(os.path.expanduser(entry.strip()))
        if not os.path.isdir(path):
            raise ConfigError(f"{PROFILES_PATH_ENV}: {entry.strip()} is not a folder; name folders that hold profiles")
        folders.append(path)
    return folders


def _record_files(folder: str) -> list[str]:
    here = os.path.join(folder, PROFILE_FILE)
    found = [here] if os.path.isfile(here) else []
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise ConfigError(f"profiles folder {folder} cannot be read: {exc.strerror or exc}") from None
    found += [
        os.path.join(folder, n, PROFILE_FILE) for n in names if os.path.isfile(os.path.join(folder, n, PROFILE_FILE))
    ]
    return found


def _read(path: str) -> dict:
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    return data


def _build(data: dict, *, path: str) -> Profile:
    """The record, from the dataclass's own constructor (unknown and missing keys refused)."""
    try:
        record = Profile(**data)
    except TypeError as exc:
        from sglfix.common.schema import nearest

        text = str(exc).split("__init__() ", 1)[-1]
        key = text.rsplit("'", 2)[-2] if text.count("'") >= 2 else ""
        fields = [f for f in Profile.__dataclass_fields__ if f != "folder"]
        hint = nearest(key, fields) if "unexpected" in text else ""
        raise ConfigError(f"{path}: {text}{hint}") from None
    object.__setattr__(record, "folder", os.path.dirname(path))
    return record


def _validate(data: dict, *, path: str) -> None:
    """pydantic's check of the file against ``Profile``: every key's type, as one line."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(Profile).validate_python(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(k) for k in err["loc"]) or "the file"
        raise ConfigError(f"{path}: {where}: {err['msg']}") from None


@dataclass
class _Found:
    records: dict[str, Profile]
    data: dict[str, tuple[str, dict]]  # name -> (path, the file's keys)
    checked: bool = False


_FOUND: dict[tuple[str, ...], _Found] = {}


def _discover(folders: tuple[str, ...]) -> _Found:
    records: dict[str, Profile] = {}
    data: dict[str, tuple[str, dict]] = {}
    for folder in folders:
        for path in _record_files(folder):
            keys = _read(path)
            record = _build(keys, path=path)
            if record.name in records:
                raise ConfigError(
                    f"{path}: profile {record.name} is also {data[record.name][0]}; give one of them another name"
                )
            records[record.name] = record
            data[record.name] = (path, keys)
    if REPRODUCTION_NAME not in records:
        raise ConfigError(f"no {REPRODUCTION_NAME} profile in {', '.join(folders) or 'no folder'}: reinstall sglfix")
    return _Found(records=records, data=data)


def profiles(*, checked: bool = False) -> dict[str, Profile]:
    """Every profile in ``search_folders()``, by name (read once per set of folders). ``checked``:
    each file validated by pydantic too (once); the start-up hook never asks, as it must not import it."""
    folders = tuple(search_folders())
    found = _FOUND.get(folders)
    if found is None:
        found = _FOUND[folders] = _discover(folders)
    if checked and not found.checked:
        for name, (path, keys) in found.data.items():
            _validate(keys, path=path)
            found.records[name]._check(path=path)
        found.checked = True
    return found.records


def get_codebase(name: str, *, what: str = "code base", checked: bool = False) -> Profile:
    """The profile (and code base) ``name``, or a one-line ConfigError listing those there are.

    An engine's name (``sglang``) instead of a profile's follows what is installed: the profile
    whose range covers the installed version, else, for a version newer than every profile (a
    source checkout, a release no profile knows yet), the newest one."""
    records = profiles(checked=checked)
    key = name.strip()
    record = records.get(key)
    if record is not None:
        return record
    engine = [r for r in records.values() if not r.is_reproduction and key in (r.distribution, r.package)]
    if engine:
        return _follow_installed(key, engine, what=what)
    from sglfix.common.schema import nearest

    engines = sorted({r.distribution for r in records.values() if r.distribution})
    also = f", or an engine's name for the one installed ({', '.join(engines)})" if engines else ""
    raise ConfigError(
        f"{what}: no profile {name!r}{nearest(name, records)}; profiles: {', '.join(records)}{also} "
        f"(found in {', '.join(search_folders())}; {PROFILES_PATH_ENV} adds folders)"
    )


def _follow_installed(asked: str, engine: list[Profile], *, what: str) -> Profile:
    from sglfix.codebases.installed import installed

    newest_first = sorted(engine, key=lambda r: _version_key(r.version, where=r.name), reverse=True)
    newest, oldest = newest_first[0], newest_first[-1]
    here = installed(newest)
    if here is None:
        raise ConfigError(
            f"{what} {asked} follows the installed {newest.package}, but none is importable here; "
            f"install it: {newest.install_hint}"
        )
    if not here.known:
        raise ConfigError(unknown_version(here, what=f"{what} {asked}"))
    chosen = next((r for r in newest_first if r.covers(here.version)), None)
    beyond = None
    if chosen is None:
        if _version_key(here.version, where=here.path) < _version_key(oldest.version, where=oldest.name):
            raise ConfigError(
                f"{what} {asked}: {newest.package} {here.version} is installed ({here.path}), older than every "
                f"profile (the oldest, {oldest.name}, covers {oldest.versions or oldest.version}); install a "
                f"{oldest.distribution} it covers, or write a profile for it (docs/how-to/add-a-profile.md)"
            )
        chosen, beyond = newest, here.version
    followed = copy.copy(chosen)
    object.__setattr__(followed, "asked", asked)
    object.__setattr__(followed, "beyond", beyond)
    return followed


def unknown_version(here: Any, *, what: str) -> str:
    """The one line for a code base whose version cannot be read (a source tree that records none)."""
    from sglfix.codebases.installed import CODEBASE_VERSION_ENV

    return (
        f"{what}: the version of {here.path} cannot be read (a source tree without its generated "
        f"_version.py, no version in its pyproject.toml, no release tag v* in its git history); give "
        f"--codebase-version V, the release its code is (or {CODEBASE_VERSION_ENV}=V)"
    )


def _version_key(version: str | None, *, where: str) -> Any:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        raise ConfigError(f"{where}: comparing versions needs packaging; pip install packaging") from None
    try:
        return Version(version or "0")
    except InvalidVersion:
        raise ConfigError(f"{where}: version {version!r} is not a version (PEP 440)") from None


def engine_version(toggles_dir: str) -> str | None:
    """The installed version of the engine whose profile keeps its toggles in ``toggles_dir``,
    which picks each toggle part's variant (None: the reproduction's toggles, a folder no profile
    names, or an engine not importable here). Light: the start-up hook asks."""
    from sglfix.codebases.installed import installed

    real = os.path.realpath(toggles_dir)
    for record in profiles().values():
        if not record.is_reproduction and os.path.realpath(record.toggles_dir) == real:
            here = installed(record)
            return None if here is None or here.version == "unknown" else here.version
    return None


class _Records(Mapping):
    """The profiles found now, by name, as a mapping (read on first use, not at import)."""

    def __getitem__(self, name: str) -> Profile:
        return profiles()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(profiles())

    def __len__(self) -> int:
        return len(profiles())


CODEBASES: Mapping[str, Profile] = _Records()
