"""The worker process: its channel to the parent, its boot, and its request loop.

``python -P -m sglfix.execution.serve`` runs ``serve()``. The parent-side handle is
``sglfix.execution.worker``; what one request does (switch toggle sets, run a cell) is
``sglfix.execution.session``; the snapshot that proves a toggle set left nothing behind is
``sglfix.execution.snapshot``.

Channels. Requests and replies travel on two dedicated pipes whose fd numbers reach the worker
in the environment; the worker makes them non-inheritable at once. The code under test may
print anything and may start subprocesses, so its stdout is never the reply channel and its
children never hold the channel open.

Memory. A CPU worker's address space is capped (``_cap_memory``): metadata gone wrong (a poison
value read as a length) makes the code allocate for billions of entries, and without a cap the
machine's memory runs out and the kernel kills whatever it picks, this run's other workers or
processes that are none of sglfix's. Under the cap the allocation fails in the cell, which says so
(the code's CRASH where the code asked for it). GPU workers are not capped: CUDA reserves address
space far beyond what it uses.

Death. When the parent dies without killing the worker's group (SIGKILL, OOM), the kernel kills
the worker (``PR_SET_PDEATHSIG``) and a small forked guard kills the rest of its group.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.execution.devices import memory_cap
from sglfix.execution.session import Session, first_line

__all__ = ["SPEC_ENV", "serve"]

SPEC_ENV = envs.SGLFIX_WORKER.name  # the worker's channel and settings; removed from its env at once

_CHANNEL: _Channel | None = None  # this process's reply channel, once serve() opened it


class _Channel:
    """Line-delimited JSON on the two dedicated pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = os.fdopen(read_fd, "rb")
        self._out = write_fd

    def requests(self):
        for line in self._in:  # EOF: the parent closed the pipe or died
            if line.strip():
                yield json.loads(line)

    def send(self, message: dict) -> None:
        view = memoryview((json.dumps(message) + "\n").encode())
        while view:
            view = view[os.write(self._out, view) :]


def _die_with_parent(parent: int) -> None:
    """Best effort: the kernel kills this worker when the parent process dies, however it dies."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
            # PR_SET_CHILD_SUBREAPER: an orphan of the code under test (a double fork, a child in
            # a session of its own) is reparented here, not to init, so the parent's kill of
            # everything below this worker reaches it.
            libc.prctl(36, 1, 0, 0, 0)
        except Exception:
            pass
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


def _cap_memory(device: str) -> None:
    if device != "cpu":
        return
    cap = memory_cap()
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if cap is not None and (hard == resource.RLIM_INFINITY or cap < hard):
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass  # no cap where the platform has none to set


def _guard_group(read_fd: int, write_fd: int) -> None:
    """Fork a small guard that kills this worker's whole process group, the children of the code
    under test included, when the parent goes away, however it goes (PR_SET_PDEATHSIG kills the
    worker alone). The parent holds the only write end of the request pipe, so that pipe hangs
    up exactly then. Forked before torch is imported: a small, single-threaded copy."""
    if not hasattr(os, "fork"):
        return
    if os.fork():
        return
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(write_fd)
        poller = select.poll()
        poller.register(read_fd, 0)  # no POLLIN: wake on hang-up only, never on a request
        while True:
            if poller.poll():
                os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _import_under_test(cb) -> list[str]:
    """Import every module under test now, so that the state snapshot covers all of them and
    no cell pays for an import. A module whose third-party dependency is missing is skipped.
    The reproduction is walked whole; an installed engine is far larger than what the harness
    drives, so its code base names the modules to load (``preload``)."""
    import importlib
    import pkgutil

    if cb.distribution is None:
        root = importlib.import_module(cb.package)
        names = [info.name for info in pkgutil.walk_packages(root.__path__, prefix=root.__name__ + ".")]
    else:
        names = list(cb.preload)
        if cb.kit:  # the kit's modules its fixtures drive (the kit package itself imports nothing)
            names += list(getattr(importlib.import_module(cb.kit), "KIT_MODULES", ()))
    names += list(cb.adapters.values())
    # A profile covers a range of releases: a module of its preload that this release does not
    # have yet is left out, and the modules its reverts patch at this release are loaded instead.
    absent = set(cb.preload) if cb.distribution is not None else set()
    skipped = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc.name or "sglfix"
            if missing == name and name in absent:
                skipped.append(f"{name}: not in this release")
                continue
            if missing.startswith("sglfix") or missing == name:
                raise
            skipped.append(f"{name}: {first_line(exc)}")
    if cb.distribution is not None and cb.toggles_dir:
        from sglfix.toggling.revert import import_target_modules

        import_target_modules(cb.toggles_dir)
    if cb.kit:  # what the kit sets up once per process (a release's single-rank groups)
        boot = getattr(importlib.import_module(cb.kit), "BOOT", None)
        if boot:
            module, _, function = boot.partition(":")
            getattr(importlib.import_module(f"{cb.kit}.{module}"), function)()
    return skipped


def _boot(device: str, codebase: str = "reproduction", *, record: bool = False) -> dict:
    from sglfix import codebases

    cb = codebases.get_codebase(codebase)
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        if shown:  # --devices (or Ray) chose the GPU: say which one is missing
            raise ConfigError(
                f"no CUDA device {shown} here (CUDA_VISIBLE_DEVICES={shown}); give --devices "
                "the GPUs this machine has (or all), or use --device cpu"
            )
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")
    if device == "cpu":
        # Read when the kernels are decorated, i.e. when the code under test is imported just below.
        os.environ["TRITON_INTERPRET"] = "1"
    found = codebases.check_installed(cb, what=f"the worker's code base {cb.name}")
    standins = codebases.activate(cb)  # before the code base is imported: stand-ins must come first
    if record:  # the result store keys a result on the code the boot ran, too
        from sglfix.execution.entered import record_boot

        skipped = record_boot(lambda: _import_under_test(cb), package=cb.package)
    else:
        skipped = _import_under_test(cb)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    keeps_caches, triton_key = False, None
    if device == "cuda":
        from sglfix.harness.tritonkey import remember_triton_key

        triton_key = remember_triton_key() if triton_version else None
        from sglfix.harness.allocator import keep_caches_across_captures

        keeps_caches = keep_caches_across_captures()
        from sglfix.harness.capturegc import hold_gc_during_captures

        hold_gc_during_captures()
    interpreter = None
    if device == "cpu":
        from sglfix.harness import interpreter as interp

        interpreter = interp.stats() if interp.install() else None
    loaded = sorted(name for name in sys.modules if name == cb.package or name.startswith(cb.package + "."))
    reproduction = [n for n in sys.modules if n.startswith(codebases.REPRODUCTION.package)]
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "pid": os.getpid(),
        "skipped": skipped,
        "interpreter": interpreter,
        "keeps_caches": keeps_caches,
        "triton_key": triton_key,
        "codebase": {
            "name": cb.name,
            **found.to_json(),
            "standins": standins,
            "modules_loaded": len(loaded),
            "reproduction_modules_loaded": len(reproduction),
            "followed": cb.asked or None,
            "beyond_range": cb.beyond,
            "release": envs.SGLFIX_RELEASE.get(),
        },
    }


def _check(argv: list[str]) -> None:
    """``python -m sglfix.execution.serve --check [--device D]``: boot once, print what it found."""
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else "auto"
    codebase = argv[argv.index("--codebase") + 1] if "--codebase" in argv[:-1] else "reproduction"
    with _collector_held_for_boot():
        info = _boot(device, codebase)
    print(json.dumps(info))


class _Profiled:
    """``SGLFIX_WORKER_PROFILE=DIR`` (a diagnosis, never a default): this worker runs under
    cProfile from boot on, its stats written to ``DIR/worker-<pid>.prof`` at most every two
    seconds between cells (a worker is killed, never asked to exit: there is no last word)."""

    def __init__(self, folder: str) -> None:
        import cProfile

        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"worker-{os.getpid()}.prof")
        self.profile = cProfile.Profile()
        self.last = time.monotonic()
        self.profile.enable()

    def dump_now(self) -> None:
        if time.monotonic() - self.last < 2:
            return
        self.profile.disable()
        try:
            self.profile.dump_stats(self.path)
        finally:
            self.last = time.monotonic()
            self.profile.enable()


@contextlib.contextmanager
def _collector_held_for_boot() -> Iterator[None]:
    """No cyclic garbage collection while a worker boots, then one, then what is left frozen.

    The boot imports the code under test (1288 modules of real sglang) and takes the clean
    snapshot: hundreds of thousands of objects that live as long as the worker. The collector
    walked them again and again as they were made (ten full collections, 3-4 s of a real-sglang
    boot on the CPU box) and would walk them at every full collection after. Held off, then one
    collection for the garbage the boot did leave, then ``gc.freeze``: later collections walk only
    what the cells make. The collector is on again for the cells, as it was (sglfix.harness.
    capturegc holds it off during each CUDA graph capture)."""
    import gc

    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    except BaseException:  # a boot that failed: the worker is on its way out
        if was_on:
            gc.enable()
        raise
    gc.collect()
    gc.freeze()
    if was_on:
        gc.enable()


def _timeline() -> Any:
    """``SGLFIX_WORKER_TIMELINE=DIR`` (a diagnosis): one line per request to
    ``DIR/worker-<pid>.timeline``, when it came and when its reply went (seconds since the epoch),
    so that a run's idle time shows between the lines."""
    folder = envs.SGLFIX_WORKER_TIMELINE.get()
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return open(os.path.join(folder, f"worker-{os.getpid()}.timeline"), "a", buffering=1)


def _profiler() -> _Profiled | None:
    folder = envs.SGLFIX_WORKER_PROFILE.get()
    return _Profiled(folder) if folder else None


def serve() -> None:
    """The worker's loop (``python -P -m sglfix.execution.serve``)."""
    global _CHANNEL
    raw = envs.SGLFIX_WORKER.unset()
    if raw is None:
        _check(sys.argv[1:])
        return
    spec = json.loads(raw)
    read_fd, write_fd = spec["fds"]
    for fd in (read_fd, write_fd):
        os.set_inheritable(fd, False)
    _die_with_parent(spec["parent"])
    _guard_group(read_fd, write_fd)
    _cap_memory(spec["device"])
    _CHANNEL = channel = _Channel(read_fd, write_fd)
    profiler = _profiler()
    began = time.perf_counter()
    with _collector_held_for_boot():
        try:
            info = _boot(spec["device"], spec.get("codebase", "reproduction"), record=bool(spec.get("deps")))
            info["boot_s"] = round(time.perf_counter() - began, 3)
        except ConfigError as exc:
            channel.send({"fatal": first_line(exc)})
            sys.exit(2)
        channel.send({"ready": info})
        session = Session(
            device=info["device"],
            allowed_prefixes=tuple(spec["allowed_prefixes"]) if spec.get("allowed_prefixes") is not None else None,
            candidates=[tuple(c) for c in _candidates_of(spec)],
        )
    timeline = _timeline()
    for request in channel.requests():
        began = time.time()
        reply = session.handle(request)
        if profiler is not None:
            profiler.dump_now()
        channel.send(reply)
        if timeline is not None:
            cell = f"{','.join(request.get('toggles') or []) or 'baseline'}::{(request.get('scenario') or {}).get('name', '-')}"
            timeline.write(f"{began:.4f} {time.time():.4f} {cell}\n")
        if "restart" in reply or "lost" in reply:  # a fresh process for the next cell
            return


def _candidates_of(spec: dict) -> list:
    """The candidate fixes of a start-up spec: inline, or in the file the parent keeps for them."""
    if spec.get("candidates_file"):
        with open(spec["candidates_file"], encoding="utf-8") as fh:
            return json.load(fh)
    return list(spec.get("candidates") or ())


if __name__ == "__main__":
    # Run with -m, this file is ``__main__``: a copy beside the module the rest of sglfix imports.
    # The loop runs in that module, so the channel and the state live where they are looked up.
    from sglfix.execution import serve as _module

    _module.serve()
