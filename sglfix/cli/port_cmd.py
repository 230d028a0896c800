"""``sglfix toggle port``: re-anchor the profile's toggles onto another version's source and say,
part by part, whether each applies as it is, was ported, cannot exist there (the release
predates the fix) or could not be ported (the function and its lines); ``--write`` keeps the
ported and absent ones as the profile's variants for that range of versions
(``variants/<pr>.yaml``), which every run on such a release then uses.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sglfix.cli.context import err, options, out
from sglfix.codebases.installed import UNKNOWN
from sglfix.common.errors import ConfigError

_STATUS = {"applies": "applies", "ported": "PORTED", "absent": "absent", "failed": "NOT PORTED"}


def port_cmd(
    ctx: typer.Context,
    source: str | None = typer.Option(
        None,
        "--source",
        metavar="DIR",
        help="The other version's source root (the folder that holds sglang/); default: where it is imported "
        "from here (with --release V: that release).",
    ),
    versions: str | None = typer.Option(
        None,
        "--versions",
        metavar="RANGE",
        help="The versions the variants cover, as PEP 440 specifiers (default: ==the source's version).",
    ),
    write: bool = typer.Option(False, "--write", help="Write the ported and absent parts as variants of the profile."),
    json_file: str | None = typer.Option(None, "--json", metavar="FILE", help="Write the result as JSON."),
) -> None:
    """Re-anchor the profile's reverts onto another release's source; --write keeps them as variants."""
    from sglfix.report.output import check_output_path, write_json
    from sglfix.toggling.port import port_registry
    from sglfix.toggling.registry import load_registry
    from sglfix.toggling.variants import version_range

    opts = options(ctx)
    profile = opts.active_profile()
    if profile.is_reproduction:
        raise ConfigError("toggle port re-anchors an engine's toggles onto another release: give --profile sglang-X")
    _check_given(source=source, versions=versions, release=opts.release)
    check_output_path(json_file, option="--json")
    root, version = _source_of(profile, source)
    known = bool(version) and version != UNKNOWN
    if versions is None:
        if not known:
            raise ConfigError(f"the version of {root / profile.package} is unknown: give --versions RANGE")
        versions = f"=={version}"
    try:
        covered = version_range(versions)
    except ConfigError as exc:
        raise ConfigError(f"--versions: {exc}") from None
    _check_range(versions, covered, version=version, profile=profile)
    # At a known version, a part that already has a variant there is checked as it is.
    registry = (
        load_registry(profile.toggles_dir, version=version) if known else load_registry(profile.toggles_dir, own=True)
    )
    results = port_registry(registry, source_dir=root)
    for r in results:
        line = f"{_STATUS[r.status]:<10} {r.id}"
        if r.changed:
            line += f"  (re-anchored: {', '.join(r.changed)})"
        if r.why:
            line += f"  {r.why}"
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    counts = {s: sum(r.status == s for r in results) for s in _STATUS}
    err.print(
        f"sglfix toggle port: {root / profile.package} ({version or 'version unknown'}), {versions}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items()),
        highlight=False,
        markup=False,
    )
    written: list[str] = []
    if write:
        written = _write(profile.toggles_dir, registry, results, versions=versions, ported_from=profile.version)
        for path in written:
            err.print(f"sglfix: wrote {path}", highlight=False, markup=False)
    if json_file is not None:
        write_json(
            json_file,
            {
                "source": str(root / profile.package),
                "version": version,
                "versions": versions,
                "profile": profile.name,
                "parts": [r.to_json() for r in results],
                "counts": counts,
                "written": written,
            },
        )
    if counts["failed"]:
        raise typer.Exit(1)


def _check_given(*, source: str | None, versions: str | None, release: str | None) -> None:
    if source is not None and release is not None:
        raise ConfigError(f"--source {source} and --release {release} both name the source to port onto: give one")
    if source is not None and not source.strip():
        raise ConfigError("--source '': give the folder that holds the other version's sglang/")
    if versions is not None and not versions.strip():
        raise ConfigError("--versions '': give the range the variants cover, like '>=0.5.18,<0.5.22'")


def _source_of(profile, source: str | None) -> tuple[Path, str | None]:
    """The source root to port onto (``--source``, else where the engine is imported from here,
    a ``--release`` included) and its version (None: unknown)."""
    from sglfix.codebases.installed import installed, version_of_tree
    from sglfix.common.codebase import package_dir

    if source is None:
        where = package_dir(profile.package)
        if where is None:
            raise ConfigError(f"{profile.package} is not importable here: give --source DIR or --release VERSION")
        root, here = Path(where).parent, installed(profile)
        version = here.version if here and here.known else None
    else:
        root, version = Path(source), version_of_tree(source, profile)
    if not (root / profile.package).is_dir():
        raise ConfigError(f"--source {root}: no {profile.package}/ folder there; give the folder that holds it")
    return root, version


def _check_range(text: str, covered, *, version: str | None, profile) -> None:
    """The variants written for ``text`` must hold the source they were ported onto, and must not
    take the place of the profile's own patches at the version they are written for."""
    from packaging.version import InvalidVersion, Version

    try:
        here = Version(version) if version and version != UNKNOWN else None
    except InvalidVersion:
        here = None
    if here is not None and here not in covered:
        raise ConfigError(
            f"--versions {text} does not hold {version}, the version of the source the parts are ported onto; "
            f"give a range that holds it (e.g. =={version})"
        )
    own = Version(profile.version) if profile.version else None
    if own is not None and own in covered and here != own:
        raise ConfigError(
            f"--versions {text} holds {profile.version}, the version {profile.name}'s own patches are written for; "
            f"end the range before it (e.g. <{profile.version})"
        )


def _write(toggles_dir: str, registry, results, *, versions: str, ported_from: str | None) -> list[str]:
    """Each toggle's ported and absent parts into ``variants/<pr>.yaml``, replacing the variants
    of the same range and keeping the others; written whole or not at all."""
    from sglfix.common.yamlio import load_yaml
    from sglfix.report.output import write_atomic
    from sglfix.toggling.fromdiff import to_yaml
    from sglfix.toggling.variants import VARIANTS_DIR

    by_toggle: dict[int, dict[str, dict]] = {}
    for r in results:
        if r.status not in ("ported", "absent") or r.variant:
            continue
        pr, _, part = r.id.partition(":")
        entry: dict = {"versions": versions}
        if r.status == "absent":
            entry["absent"] = r.why
        else:
            entry["ported_from"] = ported_from or ""
            entry["patches"] = [
                {
                    "target": p.target,
                    **({"preamble": p.preamble} if p.preamble else {}),
                    "edits": [{k: v for k, v in e.model_dump().items() if v} for e in p.edits],
                }
                for p in r.patches
            ]
        by_toggle.setdefault(int(pr), {})[part or "main"] = entry
    paths: list[str] = []
    for pr, parts in sorted(by_toggle.items()):
        toggle = registry.toggles[pr]
        path = os.path.join(toggles_dir, VARIANTS_DIR, os.path.basename(toggle.path))
        data = {"pr": pr, "parts": {}}
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                data = load_yaml(fh.read(), source=path) or data
        for name, entry in parts.items():
            kept = [v for v in data["parts"].get(name, []) if v.get("versions") != versions]
            data["parts"][name] = [*kept, entry]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, to_yaml(data))
        paths.append(path)
    return paths
