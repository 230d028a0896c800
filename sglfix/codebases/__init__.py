"""Code bases the harness replays scenarios through: the reproduction, or an installed sglang.

A profile (``sglfix.toggling.profiles``) names its toggle files *and* its code base. The
reproduction (``sglfix.backends``) is part of sglfix and always there; a real-sglang code base
is the ``sglang`` distribution of one exact version, found without importing it (the CLI parent
never imports the engine), and refused in one line when it is missing or of another version.

Which code base a process replays through is process state: a worker activates one at boot
(``activate``) and everything that asks "is this frame the code under test?", "which adapter
runs backend X?" reads ``active()``. Imports nothing heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sglfix.common.errors import ConfigError

__all__ = [
    "CODEBASES",
    "REPRODUCTION",
    "CodeBase",
    "Installed",
    "activate",
    "active",
    "check_installed",
    "check_interpreter",
    "check_scenarios_runnable",
    "get_codebase",
    "installed",
]


@dataclass(frozen=True)
class CodeBase:
    name: str
    package: str  # the top-level package whose modules are the code under test
    summary: str
    # backend name -> module defining ``ADAPTER`` for this code base
    adapters: dict[str, str] = field(default_factory=dict)
    distribution: str | None = None  # None: the reproduction, shipped inside sglfix
    version: str | None = None  # the exact version a profile is written for
    # Forward modes the scenario format has and this code base does not (refused before any cell).
    lacks_modes: dict[str, str] = field(default_factory=dict)
    # Packages the code base imports at module level that a CPU machine cannot install.
    standins: tuple[str, ...] = ()
    # Capability queries of a stood-in package that the code base implements itself
    # (stand-in path -> "module:function"); see sglfix.codebases.standins.
    standin_equivalents: dict[str, str] = field(default_factory=dict)
    # How to install it, for the one-line refusal.
    install_hint: str = ""
    # Modules a worker imports at boot (an installed engine is far larger than what the harness
    # drives; the reproduction is imported whole): every module a toggle of the profile targets
    # or an adapter drives, so the worker's state snapshot covers them.
    preload: tuple[str, ...] = ()
    # probe name (sglfix.scenario.modes.PROBE_RULES) -> module defining ``PROBE`` for this code base
    probes: dict[str, str] = field(default_factory=dict)
    # The package holding every use of the engine's private attention test kit, pinned to this
    # version (sglfix.harness.kits; its KIT_MODULES are preloaded too); None: the code base has no kit.
    kit: str | None = None
    # The oldest triton whose interpreter runs this code base's kernels on CPU (None: any). Checked
    # before a CPU run, not pinned in an extra: a CUDA torch pins its own triton, and on a GPU the
    # kernels are compiled, not interpreted.
    interpreter_triton: str | None = None
    # Where the package's files sit in the code base's own repository, as a fix's diff names them
    # (``sglfix toggle from-diff``): backends/... for the reproduction, python/sglang/... for sglang.
    repo_prefix: str = ""


REPRODUCTION = CodeBase(
    name="reproduction",
    package="sglfix.backends",
    repo_prefix="backends/",
    summary="the reproduction under sglfix.backends, shipped with sglfix",
    adapters={
        "triton": "sglfix.harness.adapters.triton",
        "flashinfer": "sglfix.harness.adapters.flashinfer",
        "flashinfer_mla": "sglfix.harness.adapters.flashinfer_mla",
        "trtllm_mla": "sglfix.harness.adapters.trtllm_mla",
        "deepseek_v4": "sglfix.harness.adapters.deepseek_v4",
    },
)

SGLANG_0_5_23 = CodeBase(
    name="sglang-0.5.23",
    package="sglang",
    repo_prefix="python/sglang/",
    distribution="sglang",
    version="0.5.23",
    kit="sglfix.harness.kits.sglang_0_5_23",
    interpreter_triton="3.9",  # older interpreters fail on sglang's kv_index_translator kernels
    summary="the installed sglang 0.5.23 (its own backends, memory pools, ForwardBatch and test kit)",
    adapters={
        "triton": "sglfix.harness.adapters.sglang.triton",
        "deepseek_v4": "sglfix.harness.adapters.sglang.deepseek_v4",
        "flashinfer": "sglfix.harness.adapters.sglang.flashinfer",
        "flashinfer_mla": "sglfix.harness.adapters.sglang.flashinfer_mla",
        "trtllm_mla": "sglfix.harness.adapters.sglang.trtllm_mla",
    },
    lacks_modes={"DRAFT_EXTEND": "sglang 0.5.23 has no ForwardMode.DRAFT_EXTEND (spec v1); use DRAFT_EXTEND_V2"},
    standins=("sgl_kernel", "torchvision"),
    standin_equivalents={
        # TritonAttnBackend asks sgl_kernel whether the GPU supports programmatic dependent launch;
        # sglang's own JIT kernels ask the same of sglang.kernels.jit (compute capability >= 9).
        "sgl_kernel.utils.is_arch_support_pdl": "sglang.kernels.jit.utils.arch:is_arch_support_pdl",
    },
    probes={
        "req-to-token-headroom": "sglfix.harness.probes.sglang.req_to_token_headroom",
        "eagle-prefill-tail": "sglfix.harness.probes.sglang.eagle_prefill_tail",
        "draft-positions": "sglfix.harness.probes.sglang.draft_positions",
        "needs-cpu-seq-lens": "sglfix.harness.probes.sglang.needs_cpu_seq_lens",
    },
    preload=tuple(
        f"sglang.{m}"
        for m in (
            "srt.layers.attention.triton_backend",
            "srt.layers.attention.flashinfer_backend",
            "srt.layers.attention.flashinfer_mla_backend",
            "srt.layers.attention.trtllm_mla_backend",
            "srt.layers.attention.deepseek_v4_backend",
            "srt.layers.attention.flashattention_backend",
            "srt.managers.overlap_utils",
            "srt.mem_cache.allocation_sizing",
            "srt.speculative.eagle_utils",
            "srt.speculative.eagle_worker_v2",
            "srt.speculative.eagle_worker_common",
            "srt.speculative.eagle_draft_cuda_graph_runner",
            "srt.debug_utils.pr_fix_toggle",
        )
    ),
    install_hint="pip install torch==2.13.0 && pip install --no-deps sglang==0.5.23 && pip install 'sglfix[sglang]'",
)

CODEBASES: dict[str, CodeBase] = {c.name: c for c in (REPRODUCTION, SGLANG_0_5_23)}

_ACTIVE: CodeBase = REPRODUCTION


def get_codebase(name: str) -> CodeBase:
    try:
        return CODEBASES[name]
    except KeyError:
        raise ConfigError(f"no code base {name!r}; known: {', '.join(CODEBASES)}") from None


def active() -> CodeBase:
    """The code base this process replays through (the reproduction unless a worker chose another)."""
    return _ACTIVE


def activate(codebase: CodeBase | str) -> list[str]:
    """Make ``codebase`` this process's code under test; install its stand-ins where the packages
    are missing. Returns the stand-ins in use. Call before the code base is imported."""
    global _ACTIVE
    from sglfix.common.codebase import set_active_package

    cb = get_codebase(codebase) if isinstance(codebase, str) else codebase
    _ACTIVE = cb
    set_active_package(cb.package)
    if not cb.standins:
        return []
    from sglfix.codebases import standins

    return standins.install(cb.standins, equivalents=cb.standin_equivalents)


@dataclass(frozen=True)
class Installed:
    distribution: str
    version: str
    path: str

    def to_json(self) -> dict:
        return {"distribution": self.distribution, "version": self.version, "path": self.path}


def installed(cb: CodeBase) -> Installed | None:
    """Where the code base is and which version, without importing it (None: not importable)."""
    from sglfix.common.codebase import package_dir

    path = package_dir(cb.package)
    if cb.distribution is None:
        from importlib import metadata

        try:
            version = metadata.version("sglfix")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return Installed(distribution="sglfix (reproduction)", version=version, path=path or "?")
    if path is None:
        return None
    version = _version_at(path, cb)
    return Installed(distribution=cb.distribution, version=version or "unknown", path=path)


def _dist_info_beside(path: str, distribution: str) -> str | None:
    """The version in the one ``<distribution>-<version>.dist-info`` folder next to the package
    at ``path`` (how pip installs it), read from the folder's name: the start-up hook asks in
    every process, and importlib.metadata costs it more than the rest of its check."""
    site = os.path.dirname(path)
    prefix = distribution.replace("-", "_").lower() + "-"
    try:
        names = [n for n in os.listdir(site) if n.endswith(".dist-info") and n.lower().startswith(prefix)]
    except OSError:
        return None
    return names[0][len(prefix) : -len(".dist-info")] if len(names) == 1 else None


def _version_at(path: str, cb: CodeBase) -> str | None:
    """The version of the distribution that owns ``path`` (the one that would be imported)."""
    beside = _dist_info_beside(path, cb.distribution)
    if beside is not None:
        return beside
    from importlib import metadata

    try:
        dist = metadata.distribution(cb.distribution)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        where = os.path.abspath(str(dist.locate_file(cb.package)))
        if os.path.realpath(where) == os.path.realpath(path):
            return dist.version
    # A checkout on sys.path, or a distribution elsewhere than the package imported: read the
    # package's own version file (sglang keeps one) without importing the package.
    for name in ("version.py", "_version.py"):
        candidate = os.path.join(path, name)
        if os.path.isfile(candidate):
            import re

            with open(candidate, encoding="utf-8") as fh:
                m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", fh.read())
            if m:
                return m.group(1)
    return dist.version if dist is not None else None


def check_installed(cb: CodeBase, *, what: str) -> Installed:
    """The installed code base, or a one-line ConfigError naming both versions and the fix."""
    found = installed(cb)
    if found is None:
        raise ConfigError(
            f"{what} replays through {cb.package} {cb.version}, but {cb.package} is not importable "
            f"here; install it: {cb.install_hint}"
        )
    if cb.version is not None and found.version != cb.version:
        raise ConfigError(
            f"{what} is written for {cb.package} {cb.version}, but {cb.package} {found.version} is "
            f"installed ({found.path}); install {cb.distribution}=={cb.version} or pick the "
            f"profile of {found.version}"
        )
    return found


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
        if backend is not None and backend not in cb.adapters:
            raise ConfigError(
                f"{where}: backend {backend} has no adapter on {cb.name} (has: "
                f"{', '.join(sorted(cb.adapters))}); drop the scenario or pick another profile"
            )
