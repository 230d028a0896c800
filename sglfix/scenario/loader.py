"""Scenario files: read, expand ``grid:``, validate, check limits and memory, select by name.

A file holds one scenario (a mapping) or several (``scenarios: [...]``). ``grid:`` expands any
key, dotted for nested ones (``model.dtype``), into the cartesian product; each expanded
scenario is named ``base@key=value,...``. Sizes are bounded before anything is expanded or run,
so a typo costs a one-line error, not a worker that allocates gigabytes or never ends.
"""

from __future__ import annotations

import copy
import fnmatch
import itertools
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.common.schema import describe_kind, nearest, show, validate_node
from sglfix.common.yamlio import LineDict, line_of, load_yaml, read_text_file
from sglfix.scenario.limits import LIMITS_HINT, MAX_FILE_BYTES, MAX_GRID_POINTS, MAX_SCENARIOS
from sglfix.scenario.memory import check_memory
from sglfix.scenario.models import BatchNode, CudaGraphNode, ModelShape, Scenario, ScenarioNode, SpecShape, valid_name

__all__ = ["builtin_scenario_dir", "load_scenario_file", "load_scenarios", "select_scenarios"]

_NESTED = {"batch": BatchNode, "model": ModelShape, "spec": SpecShape, "cuda_graph": CudaGraphNode}
_GRID_KEYS = tuple(k for k in ScenarioNode.model_fields if k not in ("grid", "name"))
_SHORT = {
    "model.dtype": "dtype",
    "cuda_graph": "cg",
    "page_size": "ps",
    "gpu_only": "gpu_only",
    "builder": "builder",
    "spec.topk": "topk",
    "spec.num_steps": "steps",
    "batch.accept_lens": "acc",
    "max_context_len": "ctx",
    "dcp_size": "dcp",
    "deterministic": "det",
    "batch.mamba_track": "track",
    "batch.mamba_track_host": "host",
    "model.linear_attention": "linear",
    "model.cross_attention": "cross",
    "batch.encoder_lens": "enc",
    "batch.items": "items",
    "model.mha_chunk": "mha",
    "mode": "mode",
}
_DTYPE_LABELS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_MAX_LABEL_CHARS = 40
_UNPRINTABLE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


# ----------------------------------------------------------------------------- one node


def _what(node: Any) -> str:
    name = node.get("name") if isinstance(node, dict) else None
    # Only a valid name goes into messages (its own error says what is wrong with it).
    return f"scenario {name}" if valid_name(name) else "scenario"


def _parse_one(node: Any, *, where: str, what: str | None = None) -> Scenario:
    parsed = validate_node(ScenarioNode, node, where=where, what=what or _what(node))
    return parsed.to_scenario(name=parsed.name, path=where, line=line_of(node))


# ----------------------------------------------------------------------------- grid


def _label(value: Any) -> str:
    if isinstance(value, list) and all(not isinstance(v, (list, dict)) for v in value):
        text = "-".join(_label(v) for v in value)
    elif isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, (list, dict)):
        text = show(value)  # bounded: a grid value may be deeply nested
    else:
        text = _DTYPE_LABELS.get(str(value).lower(), str(value))
    # A name carries no whitespace or control characters, whatever a grid value holds.
    return _UNPRINTABLE.sub("", text)[:_MAX_LABEL_CHARS]


def _graph_label(s: Scenario) -> str:
    if not s.cuda_graph:
        return "eager"
    return "graph-padded" if s.padded else "graph"


def _check_grid(node: LineDict, *, where: str) -> tuple[list[str], int]:
    """The grid's keys and its number of points, refused before anything is expanded."""
    grid = node["grid"]
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(
            f"{where}:{line_of(node, 'grid')}: grid must map keys (dotted for nested: model.dtype) to lists of values"
        )
    for key in grid:
        parts = str(key).split(".")
        if parts[0] not in _GRID_KEYS:
            raise ConfigError(
                f"{where}:{line_of(grid, key)}: grid key {key!r} is not a scenario key{nearest(parts[0], _GRID_KEYS)}"
            )
        if len(parts) > 1:
            model = _NESTED.get(parts[0])
            if model is None or len(parts) > 2 or parts[1] not in model.model_fields:
                allowed = [f"{parts[0]}.{f}" for f in model.model_fields] if model else []
                raise ConfigError(
                    f"{where}:{line_of(grid, key)}: grid key {key!r} is not a scenario key{nearest(str(key), allowed)}"
                )
        values = grid[key]
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"{where}:{line_of(grid, key)}: grid.{key} must be a non-empty list of values, "
                f"got {describe_kind(values)}"
            )
    points = math.prod(len(v) for v in grid.values())
    if points > MAX_GRID_POINTS:
        sizes = " x ".join(str(len(v)) for v in grid.values())
        raise ConfigError(
            f"{where}:{line_of(node, 'grid')}: grid expands to {points} scenarios ({sizes}), over "
            f"the limit of {MAX_GRID_POINTS} per scenario ({LIMITS_HINT}); split it or drop values"
        )
    return list(grid), points


def _planned(node: Any, *, where: str) -> int:
    """Scenarios ``node`` expands to; its grid is checked here, before anything is expanded."""
    if isinstance(node, dict) and node.get("grid") is not None:
        return _check_grid(node, where=where)[1]
    return 1


def _substitute(base: LineDict, keys: list[str], indices: tuple[int, ...], grid: LineDict, *, where: str) -> LineDict:
    """A copy of ``base`` with each grid key set; errors in a value cite the grid's line for it."""
    item = copy.deepcopy(base)
    for key, index in zip(keys, indices):
        value, value_line = grid[key][index], line_of(grid[key], index)
        parts = key.split(".")
        target = item
        for p in parts[:-1]:
            nested = target.get(p)
            if nested is None:
                nested = LineDict()
                nested.line, nested.key_lines = line_of(grid, key), {}
                target[p] = nested
                target.key_lines[p] = line_of(grid, key)
            if not isinstance(nested, dict):
                raise ConfigError(
                    f"{where}:{line_of(grid, key)}: grid key {key!r}: {p} is not a mapping "
                    f"(got {describe_kind(nested)})"
                )
            target = nested
        target[parts[-1]] = copy.deepcopy(value)
        target.key_lines[parts[-1]] = value_line
    return item


def _expand(node: Any, *, where: str) -> list[Scenario]:
    if not isinstance(node, dict):
        raise ConfigError(
            f"{where}:{line_of(node)}: a scenario must be a mapping with name, mode, batch, ...; "
            f"got {describe_kind(node)}"
        )
    if node.get("grid") is None:
        return [_parse_one(node, where=where)]
    keys, _ = _check_grid(node, where=where)
    grid = node["grid"]
    base = LineDict({k: v for k, v in node.items() if k != "grid"})
    base.line, base.key_lines = node.line, {k: v for k, v in node.key_lines.items() if k != "grid"}
    out: list[Scenario] = []
    for indices in itertools.product(*(range(len(grid[k])) for k in keys)):
        item = _substitute(base, keys, indices, grid, where=where)
        values = [grid[k][i] for k, i in zip(keys, indices)]
        point = ",".join(f"{_SHORT.get(k, k.split('.')[-1])}={_label(v)}" for k, v in zip(keys, values))
        probe = _parse_one(item, where=where, what=f"{_what(node)}@{point}")
        labels = [_graph_label(probe) if k == "cuda_graph" else _label(v) for k, v in zip(keys, values)]
        suffix = ",".join(f"{_SHORT.get(k, k.split('.')[-1])}={lab}" for k, lab in zip(keys, labels))
        out.append(probe.model_copy(update={"name": f"{probe.name}@{suffix}"}))
    return out


# ----------------------------------------------------------------------------- files


def load_scenario_file(path: str | Path, *, memory_budget: int | None = None) -> list[Scenario]:
    """Every scenario of one file, grid-expanded and checked; ConfigError (file:line) otherwise.

    ``memory_budget`` in bytes, None for ``SGLFIX_MEMORY_BUDGET`` or 8 GiB.
    """
    result = _read_file(path)
    check_memory(result, budget_bytes=memory_budget)
    return result


def _read_file(path: str | Path) -> list[Scenario]:
    where = str(path)
    text = read_text_file(path, what="scenario file", max_bytes=MAX_FILE_BYTES)
    raw = load_yaml(text, source=where)
    if isinstance(raw, dict) and "scenarios" in raw:
        extra = [k for k in raw if k != "scenarios"]
        if extra:
            raise ConfigError(
                f"{where}:{line_of(raw, extra[0])}: unknown key {extra[0]!r} in the scenario file; "
                f"a file holds one scenario or only 'scenarios: [...]'"
            )
        items = raw["scenarios"]
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{where}:{line_of(raw, 'scenarios')}: scenarios must be a non-empty list")
    elif raw is None:
        raise ConfigError(f"{where}: the scenario file is empty; write a scenario (name, mode, batch, ...)")
    else:
        items = [raw]
    planned = sum(_planned(item, where=where) for item in items)
    if planned > MAX_SCENARIOS:
        raise ConfigError(
            f"{where}:{line_of(raw)}: the file expands to {planned} scenarios, over the limit of "
            f"{MAX_SCENARIOS} ({LIMITS_HINT}); split it or shrink its grids"
        )
    return [s for item in items for s in _expand(item, where=where)]


def builtin_scenario_dir() -> str:
    from importlib.resources import files

    return str(files("sglfix.scenarios"))


def load_scenarios(
    files: Iterable[str | Path] = (),
    *,
    builtin: bool = True,
    memory_budget: int | None = None,
    builtin_dir: str | None = None,
    check_budget: bool = True,
) -> list[Scenario]:
    """The built-in scenarios (unless ``builtin=False``; those of ``builtin_dir``, a profile's,
    when given) followed by those of ``files``.

    Names must be unique; the total is bounded; each scenario's memory estimate must fit
    ``memory_budget`` bytes (None: ``SGLFIX_MEMORY_BUDGET``, else 8 GiB); ``check_budget=False``
    leaves that to the caller, who checks only the scenarios it selects.
    """
    paths = list(files)
    if builtin:
        paths = sorted(Path(builtin_dir or builtin_scenario_dir()).glob("*.yaml")) + paths
    seen: dict[str, str] = {}
    out: list[Scenario] = []
    for path in paths:
        for s in _read_file(path):
            if s.name in seen:
                raise ConfigError(
                    f"{s.path}:{s.line}: scenario name {s.name!r} is already used in {seen[s.name]}; rename one"
                )
            seen[s.name] = s.path
            out.append(s)
        if len(out) > MAX_SCENARIOS:
            raise ConfigError(
                f"{path}: with this file {len(out)} scenarios are loaded, over the limit of "
                f"{MAX_SCENARIOS} ({LIMITS_HINT}); give fewer files"
            )
    if check_budget:
        check_memory(out, budget_bytes=memory_budget)
    return out


def select_scenarios(
    scenarios: list[Scenario], *, globs: Iterable[str] = (), backend: str | None = None
) -> list[Scenario]:
    """The scenarios whose name matches one of ``globs`` (all when none), of ``backend`` if given."""
    globs = list(globs)
    if any(not g.strip() for g in globs):
        raise ConfigError(
            "-s '': an empty scenario glob selects nothing; give a name or glob (sglfix scenarios lists them)"
        )
    if backend is not None and backend not in {s.backend for s in scenarios}:
        known = sorted({s.backend for s in scenarios})
        raise ConfigError(
            f"--backend {backend}: no scenario uses this backend{nearest(backend, known)}; backends: {', '.join(known)}"
        )
    chosen = [
        s
        for s in scenarios
        if (not globs or any(fnmatch.fnmatchcase(s.name, g) for g in globs))
        and (backend is None or s.backend == backend)
    ]
    if not chosen:
        names = [s.name for s in scenarios]
        raise ConfigError(
            f"no scenario matches {' '.join(globs) or '*'}"
            + (f" with backend {backend}" if backend else "")
            + (nearest(globs[0], names) if globs else "")
            + f"; {len(names)} known (sglfix scenarios lists them)"
        )
    return chosen
