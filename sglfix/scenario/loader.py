"""Scenario files: a concrete batch to replay through a backend, validated strictly.

A file holds one scenario (a mapping) or several (``scenarios: [...]``). ``grid:`` expands any
key, dotted for nested ones (``model.dtype``), into the cartesian product; each expanded
scenario is named ``base@key=value,...``.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import itertools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from sglfix.common.errors import ConfigError
from sglfix.patching.types import check_keys, nearest
from sglfix.common.yamlio import LineDict, line_of, load_yaml

__all__ = ["Scenario", "ModelShape", "SpecShape", "load_scenario_file", "load_scenarios", "builtin_scenario_dir",
           "select_scenarios", "MODES", "BACKENDS", "DTYPES"]

MODES = ("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2")
BACKENDS = ("triton",)
DTYPES = ("float16", "bfloat16", "float32")
BUILDERS = ("kit", "glue")
DEFAULT_TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4}
_TOP = ("name", "description", "backend", "mode", "batch", "cuda_graph", "gpu_only", "page_size", "model",
        "spec", "seed", "tolerance", "builder", "grid", "sync_free")
_SHORT = {"model.dtype": "dtype", "cuda_graph": "cg", "page_size": "ps", "gpu_only": "gpu_only",
          "builder": "builder"}


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "float16"


@dataclass(frozen=True, kw_only=True)
class SpecShape:
    topk: int = 1
    num_steps: int = 3
    num_draft_tokens: int = 4


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    mode: str
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    accept_lens: tuple[int, ...] | None = None
    backend: str = "triton"
    capture_bs: tuple[int, ...] | None = None  # None: eager, no CUDA graph
    gpu_only: bool = False
    # Declared free of device->host syncs; defaults to gpu_only, except spec-v1 DRAFT_EXTEND,
    # whose accept lengths are read on the host by design.
    sync_free: bool = False
    page_size: int = 1
    model: ModelShape = field(default_factory=ModelShape)
    spec: SpecShape = field(default_factory=SpecShape)
    seed: int = 0
    tolerance: float = 1e-2
    builder: str = "kit"
    description: str = ""
    path: str = ""
    line: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def cuda_graph(self) -> bool:
        return self.capture_bs is not None

    @property
    def padded(self) -> bool:
        """A graph replay pads the raw batch up to the smallest captured size that fits."""
        return self.cuda_graph and self.graph_bs != self.batch_size

    @property
    def graph_bs(self) -> int | None:
        if self.capture_bs is None:
            return None
        return min(b for b in self.capture_bs if b >= self.batch_size)

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("path"), data.pop("line")
        return data


def _int(node, key, *, where, what, minimum=0, default=None) -> int:
    if key not in node:
        if default is None:
            raise ConfigError(f"{where}:{line_of(node)}: {what} lacks required key {key!r}")
        return default
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}:{line_of(node, key)}: {what}.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _int_list(node, key, *, where, what, minimum=0) -> tuple[int, ...]:
    value = node[key]
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
        raise ConfigError(f"{where}:{line_of(node, key)}: {what}.{key} must be a non-empty list of integers >= {minimum}, got {value!r}")
    return tuple(value)


def _bool(node, key, *, where, what, default=False) -> bool:
    value = node.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}:{line_of(node, key)}: {what}.{key} must be true or false, got {value!r}")
    return value


def _choice(node, key, choices, *, where, what, default=None) -> str:
    value = node.get(key, default)
    if value is None:
        raise ConfigError(f"{where}:{line_of(node)}: {what} lacks required key {key!r}; one of {', '.join(choices)}")
    if value not in choices:
        raise ConfigError(f"{where}:{line_of(node, key)}: {what}.{key} {value!r} is not one of {', '.join(choices)}{nearest(str(value), choices)}")
    return value


def _parse_one(node: Any, *, where: str, name_override: str | None = None, line: int = 0) -> Scenario:
    what = "scenario"
    check_keys(node, where=where, what=what, allowed=_TOP, required=("name", "mode", "batch"))
    name = name_override or node["name"]
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
        raise ConfigError(f"{where}:{line_of(node, 'name')}: scenario name must be text without spaces, got {name!r}")
    what = f"scenario {name}"
    mode = _choice(node, "mode", MODES, where=where, what=what)
    backend = _choice(node, "backend", BACKENDS, where=where, what=what, default="triton")
    builder = _choice(node, "builder", BUILDERS, where=where, what=what, default="kit")

    model_node = node.get("model", LineDict())
    check_keys(model_node, where=where, what=f"{what}.model", allowed=("num_heads", "num_kv_heads", "head_dim", "dtype"))
    model = ModelShape(
        num_heads=_int(model_node, "num_heads", where=where, what=f"{what}.model", minimum=1, default=4),
        num_kv_heads=_int(model_node, "num_kv_heads", where=where, what=f"{what}.model", minimum=1, default=2),
        head_dim=_int(model_node, "head_dim", where=where, what=f"{what}.model", minimum=16, default=64),
        dtype=_choice(model_node, "dtype", DTYPES, where=where, what=f"{what}.model", default="float16"),
    )
    if model.num_heads % model.num_kv_heads:
        raise ConfigError(f"{where}:{line_of(model_node, 'num_kv_heads')}: {what}.model.num_heads ({model.num_heads}) must be a multiple of num_kv_heads ({model.num_kv_heads})")
    if model.head_dim & (model.head_dim - 1):
        raise ConfigError(f"{where}:{line_of(model_node, 'head_dim')}: {what}.model.head_dim must be a power of two, got {model.head_dim}")

    spec_node = node.get("spec", LineDict())
    check_keys(spec_node, where=where, what=f"{what}.spec", allowed=("topk", "num_steps", "num_draft_tokens"))
    spec = SpecShape(
        topk=_int(spec_node, "topk", where=where, what=f"{what}.spec", minimum=1, default=1),
        num_steps=_int(spec_node, "num_steps", where=where, what=f"{what}.spec", minimum=1, default=3),
        num_draft_tokens=_int(spec_node, "num_draft_tokens", where=where, what=f"{what}.spec", minimum=1, default=4),
    )

    batch = node["batch"]
    check_keys(batch, where=where, what=f"{what}.batch", allowed=("prefix_lens", "extend_lens", "accept_lens"), required=("prefix_lens",))
    prefix = _int_list(batch, "prefix_lens", where=where, what=f"{what}.batch", minimum=1)
    bs = len(prefix)
    accept = None
    if "accept_lens" in batch:
        accept = _int_list(batch, "accept_lens", where=where, what=f"{what}.batch", minimum=0)
        if len(accept) != bs:
            raise ConfigError(f"{where}:{line_of(batch, 'accept_lens')}: {what}.batch.accept_lens has {len(accept)} items for {bs} requests")
        if max(accept) >= spec.num_draft_tokens:
            raise ConfigError(f"{where}:{line_of(batch, 'accept_lens')}: {what}.batch.accept_lens must be < spec.num_draft_tokens ({spec.num_draft_tokens})")
    raw_ext = batch.get("extend_lens")
    if mode == "DECODE":
        extend = (1,) * bs
    elif mode in ("TARGET_VERIFY", "DRAFT_EXTEND_V2"):
        extend = (spec.num_draft_tokens,) * bs
    elif mode == "DRAFT_EXTEND":
        if accept is None:
            raise ConfigError(f"{where}:{line_of(batch)}: {what}: DRAFT_EXTEND needs batch.accept_lens (it extends accept_len + 1 tokens)")
        extend = tuple(a + 1 for a in accept)
    else:
        if raw_ext is None:
            raise ConfigError(f"{where}:{line_of(batch)}: {what}: EXTEND needs batch.extend_lens (an integer or one per request)")
        if isinstance(raw_ext, int) and not isinstance(raw_ext, bool):
            if raw_ext < 1:
                raise ConfigError(f"{where}:{line_of(batch, 'extend_lens')}: {what}.batch.extend_lens must be >= 1")
            extend = (raw_ext,) * bs
        else:
            extend = _int_list(batch, "extend_lens", where=where, what=f"{what}.batch", minimum=1)
            if len(extend) != bs:
                raise ConfigError(f"{where}:{line_of(batch, 'extend_lens')}: {what}.batch.extend_lens has {len(extend)} items for {bs} requests")
    if raw_ext is not None and mode != "EXTEND":
        given = (raw_ext,) * bs if isinstance(raw_ext, int) else tuple(raw_ext)
        if tuple(given) != extend:
            raise ConfigError(f"{where}:{line_of(batch, 'extend_lens')}: {what}.batch.extend_lens {list(given)} contradicts mode {mode} (which extends {list(extend)}); drop it")

    capture_bs = None
    cg = node.get("cuda_graph", False)
    if cg is not False:
        if not isinstance(cg, dict):
            raise ConfigError(f"{where}:{line_of(node, 'cuda_graph')}: {what}.cuda_graph must be false or {{capture_bs: [...]}}")
        check_keys(cg, where=where, what=f"{what}.cuda_graph", allowed=("capture_bs",), required=("capture_bs",))
        capture_bs = tuple(sorted(set(_int_list(cg, "capture_bs", where=where, what=f"{what}.cuda_graph", minimum=1))))
        if max(capture_bs) < bs:
            raise ConfigError(f"{where}:{line_of(cg, 'capture_bs')}: {what}: a batch of {bs} fits no captured size {list(capture_bs)}; add one >= {bs}")
        if mode == "EXTEND":
            raise ConfigError(f"{where}:{line_of(node, 'cuda_graph')}: {what}: EXTEND is not captured in CUDA graphs; set cuda_graph: false")

    page_size = _int(node, "page_size", where=where, what=what, minimum=1, default=1)
    gpu_only = _bool(node, "gpu_only", where=where, what=what)
    if gpu_only and mode not in ("TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DECODE"):
        raise ConfigError(f"{where}:{line_of(node, 'gpu_only')}: {what}: gpu_only applies to spec-decoding and decode modes, not {mode}")
    seed = _int(node, "seed", where=where, what=what, minimum=0, default=0)
    tol = node.get("tolerance", DEFAULT_TOLERANCE[model.dtype])
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ConfigError(f"{where}:{line_of(node, 'tolerance')}: {what}.tolerance must be a number in (0, 1), got {tol!r}")
    if spec.topk != 1 and mode in ("TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"):
        raise ConfigError(f"{where}:{line_of(spec_node, 'topk')}: {what}: the Triton reproduction of {mode} supports spec.topk 1 only")
    description = node.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}:{line_of(node, 'description')}: {what}.description must be text")
    return Scenario(
        name=name, mode=mode, prefix_lens=prefix, extend_lens=extend, accept_lens=accept, backend=backend,
        capture_bs=capture_bs, gpu_only=gpu_only, sync_free=_bool(node, "sync_free", where=where, what=what, default=gpu_only and mode != "DRAFT_EXTEND"),
        page_size=page_size, model=model, spec=spec, seed=seed, tolerance=float(tol), builder=builder,
        description=description, path=where, line=line or line_of(node),
    )


def _label(value: Any) -> str:
    if isinstance(value, list):
        return "-".join(_label(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(value, str(value))


def _graph_label(s: Scenario) -> str:
    if not s.cuda_graph:
        return "eager"
    return "graph-padded" if s.padded else "graph"


def _expand(node: Any, *, where: str) -> list[Scenario]:
    if not isinstance(node, dict):
        raise ConfigError(f"{where}:{line_of(node)}: a scenario must be a mapping with name, mode, batch, ...")
    grid = node.get("grid")
    if grid is None:
        return [_parse_one(node, where=where)]
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}:{line_of(node, 'grid')}: grid must map keys (dotted for nested: model.dtype) to lists of values")
    keys = list(grid)
    for key in keys:
        head = key.split(".")[0]
        if head not in _TOP or head in ("grid", "name"):
            raise ConfigError(f"{where}:{line_of(grid, key)}: grid key {key!r} is not a scenario key{nearest(head, _TOP)}")
        if not isinstance(grid[key], list) or not grid[key]:
            raise ConfigError(f"{where}:{line_of(grid, key)}: grid.{key} must be a non-empty list of values")
    out: list[Scenario] = []
    base = {k: v for k, v in node.items() if k != "grid"}
    for values in itertools.product(*(grid[k] for k in keys)):
        item = copy.deepcopy(base)
        if not isinstance(item, LineDict):
            item = LineDict(item)
        item.line, item.key_lines = node.line, dict(node.key_lines)
        for key, value in zip(keys, values):
            parts = key.split(".")
            target = item
            for p in parts[:-1]:
                nested = target.get(p)
                if nested is None:
                    nested = LineDict()
                    nested.line, nested.key_lines = line_of(grid, key), {}
                    target[p] = nested
                if not isinstance(nested, dict):
                    raise ConfigError(f"{where}:{line_of(grid, key)}: grid key {key!r}: {p} is not a mapping")
                target = nested
            target[parts[-1]] = copy.deepcopy(value)
        probe = _parse_one(item, where=where, line=line_of(node))
        labels = [_graph_label(probe) if k == "cuda_graph" else _label(v) for k, v in zip(keys, values)]
        suffix = ",".join(f"{_SHORT.get(k, k.split('.')[-1])}={lab}" for k, lab in zip(keys, labels))
        out.append(dataclasses.replace(probe, name=f"{probe.name}@{suffix}"))
    return out


def load_scenario_file(path: str | Path) -> list[Scenario]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"scenario file {path} does not exist")
    where = str(path)
    raw = load_yaml(p.read_text(encoding="utf-8"), source=where)
    if isinstance(raw, dict) and "scenarios" in raw:
        check_keys(raw, where=where, what="scenario file", allowed=("scenarios",))
        items = raw["scenarios"]
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{where}:{line_of(raw, 'scenarios')}: scenarios must be a non-empty list")
        result = [s for item in items for s in _expand(item, where=where)]
    else:
        result = _expand(raw, where=where)
    return result


def builtin_scenario_dir() -> str:
    from importlib.resources import files

    return str(files("sglfix.scenarios"))


def load_scenarios(files: Iterable[str | Path] = (), *, builtin: bool = True) -> list[Scenario]:
    paths = list(files)
    if builtin:
        paths = sorted(Path(builtin_scenario_dir()).glob("*.yaml")) + paths
    seen: dict[str, str] = {}
    out: list[Scenario] = []
    for path in paths:
        for s in load_scenario_file(path):
            if s.name in seen:
                raise ConfigError(f"{s.path}:{s.line}: scenario name {s.name!r} is already used in {seen[s.name]}; rename one")
            seen[s.name] = s.path
            out.append(s)
    return out


def select_scenarios(scenarios: list[Scenario], *, globs: Iterable[str] = (), backend: str | None = None) -> list[Scenario]:
    globs = list(globs)
    chosen = [s for s in scenarios if (not globs or any(fnmatch.fnmatchcase(s.name, g) for g in globs))
              and (backend is None or s.backend == backend)]
    if not chosen:
        names = [s.name for s in scenarios]
        raise ConfigError(
            f"no scenario matches {' '.join(globs) or '*'}" + (f" with backend {backend}" if backend else "")
            + (nearest(globs[0], names) if globs else "") + f"; {len(names)} known (sglfix scenarios lists them)"
        )
    return chosen
