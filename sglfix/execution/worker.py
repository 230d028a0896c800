"""Long-lived worker processes that run cells: the worker's loop and the parent-side handle.

A fresh process that imports torch and initialises CUDA costs seconds, so a worker runs many
cells and is replaced only after a fault, a timeout, or when a toggle set left state behind.
Each request names a toggle set; the worker applies it the way production does (it sets
``SGLANG_DEBUG_REVERT_PR`` in its own environment and calls ``maybe_revert_pr_fix()``),
restoring the previous set first.

Channels. Requests and replies travel on two dedicated pipes whose fd numbers reach the worker
in the environment; the worker makes them non-inheritable at once. The code under test may
print anything and may start subprocesses, so its stdout is never the reply channel and its
children never hold the channel open. The worker's stdout and stderr go to a third pipe that
the parent drains, keeping the tail for FAULT messages; stdin is /dev/null. Every request
carries an id, the reply echoes it, and a reply with another id is dropped.

Life and death. Each worker leads its own process group (its own session), so one
``killpg(SIGKILL)`` also takes the children of the code under test; the parent does that on
close, timeout and fault, and at exit. When the parent dies without doing so (SIGKILL, OOM),
the kernel kills the worker (``PR_SET_PDEATHSIG``) and a small forked guard kills the rest of
its group. Death is detected from the process, not from EOF on a pipe, because a surviving
child of the code under test may keep the pipe open. Every wait is bounded.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from sglfix.common.errors import ConfigError, SglfixError
from sglfix.harness.cell import CellResult

__all__ = ["Worker", "WorkerConfig", "WorkerStartError", "Event", "serve"]

DEVICES = ("auto", "cpu", "cuda")
STARTUP_TIMEOUT = 300.0  # importing torch, initialising CUDA, importing the backends
KILL_WAIT = 5.0  # after SIGKILL only a process stuck in the kernel outlives this
TAIL_BYTES = 16384
_SPEC_ENV = "SGLFIX_WORKER"  # the worker's channel and settings; removed from its env at once
_REVERT_ENV = "SGLANG_DEBUG_REVERT_PR"
_TOGGLES_ENV = "SGLFIX_TOGGLES_DIR"
_UNDER_TEST = "sglfix.backends"
_CHECK_HINT = "check the install with: python -m sglfix.execution.worker --check"


class WorkerStartError(SglfixError):
    """A worker process could not even start (import error, broken install)."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs; every worker of a pool gets all of it."""

    device: str
    toggles_dir: str | None = None
    allowed_prefixes: tuple[str, ...] | None = None
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"--device {self.device!r} is not one of auto, cpu, cuda")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            shown = f"{t:g}" if isinstance(t, (int, float)) and not isinstance(t, bool) else repr(t)
            raise ConfigError(f"--timeout {shown}: must be a finite number of seconds > 0; pass e.g. --timeout 300")
        if self.toggles_dir is not None:
            path = os.path.abspath(os.fspath(self.toggles_dir))
            if not os.path.isdir(path):
                raise ConfigError(f"toggles directory {path} does not exist; pass an existing --toggles DIR")
            object.__setattr__(self, "toggles_dir", path)
        if self.allowed_prefixes is not None:
            object.__setattr__(self, "allowed_prefixes", tuple(str(p) for p in self.allowed_prefixes))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------

_CHANNEL: "_Channel | None" = None  # this process's reply channel, once serve() opened it


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
            view = view[os.write(self._out, view):]


def _die_with_parent(parent: int) -> None:
    """Best effort: the kernel kills this worker when the parent process dies, however it dies."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:
            pass
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


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


def _import_under_test() -> list[str]:
    """Import every module under test now, so that the state snapshot covers all of them and
    no cell pays for an import. A module whose third-party dependency is missing is skipped."""
    import importlib
    import pkgutil

    import sglfix.backends as root

    skipped = []
    for info in pkgutil.walk_packages(root.__path__, prefix=root.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            if (exc.name or "sglfix").startswith("sglfix"):
                raise
            skipped.append(f"{info.name}: {_first_line(exc)}")
    return skipped


def _boot(device: str) -> dict:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        if shown:  # --devices (or Ray) chose the GPU: say which one is missing
            raise ConfigError(f"no CUDA device {shown} here (CUDA_VISIBLE_DEVICES={shown}); give --devices "
                              "the GPUs this machine has (or all), or use --device cpu")
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")
    if device == "cpu":
        # Read when the kernels are decorated, i.e. when the backends are imported just below.
        os.environ["TRITON_INTERPRET"] = "1"
    skipped = _import_under_test()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    interpreter = None
    if device == "cpu":
        from sglfix.harness import interpreter as interp

        interpreter = interp.stats() if interp.install() else None
    return {"device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton_version, "pid": os.getpid(), "skipped": skipped,
            "interpreter": interpreter}


_MISSING = object()


class _Contents:
    """A shallow copy of a mutable container, compared item by item by identity."""

    __slots__ = ("items",)

    def __init__(self, value: Any) -> None:
        self.items = tuple(value.items()) if isinstance(value, dict) else tuple(value)

    def same(self, other: "_Contents") -> bool:
        return len(self.items) == len(other.items) and all(
            (a is b) if not isinstance(a, tuple) else (a[0] is b[0] and a[1] is b[1])
            for a, b in zip(self.items, other.items))


class StateSnapshot:
    """What the modules under test bind, by identity: module attributes, one level into their
    dicts, lists and sets, class attributes, and each function's code and defaults.

    A name rebound or removed is a change. A name added is not, unless it shadows a builtin:
    the Triton interpreter adds its helpers to a kernel's module the first time it runs it,
    and code that never had a name cannot read it. Added names join the snapshot, so a later
    rebinding of them is seen. Holds references, so an id cannot be reused between snapshots.
    In-place changes deeper than one level (a tensor's contents, an object's fields) are not seen.

    A module attribute that was ``None`` in the snapshot and is bound now is upstream's lazy
    module cache (``global_workspace_buffer``: allocated by the first backend built in the
    process): ``reset_lazy`` puts ``None`` back, which is exactly the snapshot's state, so the
    next set starts from it without a fresh process.
    """

    def __init__(self, prefix: str = _UNDER_TEST) -> None:
        self.prefix = prefix
        self.entries = self._take()

    def _take(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, module in sorted(sys.modules.items()):
            if module is None or not (name == self.prefix or name.startswith(self.prefix + ".")):
                continue
            out[name] = module
            for key, value in list(vars(module).items()):
                self._add(out, f"{name}.{key}", value)
                if isinstance(value, (dict, list, set)) and not key.startswith("__"):
                    out[f"{name}.{key}[...]"] = _Contents(value)
                if isinstance(value, type) and value.__module__ == name:
                    for attr, member in list(vars(value).items()):
                        self._add(out, f"{name}.{key}.{attr}", member)
        return out

    @staticmethod
    def _add(out: dict, path: str, value: Any) -> None:
        out[path] = value
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if hasattr(fn, "__code__") and hasattr(fn, "__defaults__"):
            out[path + ".__code__"] = fn.__code__
            out[path + ".__defaults__"] = fn.__defaults__
            out[path + ".__kwdefaults__"] = fn.__kwdefaults__

    def reset_lazy(self) -> list[str]:
        """Rebind to ``None`` every module attribute that was ``None`` in the snapshot; the paths."""
        reset = []
        for path, old in self.entries.items():
            if old is not None:
                continue
            owner, _, name = path.rpartition(".")
            module = self.entries.get(owner)
            if isinstance(module, type(sys)) and getattr(module, name, None) is not None:
                setattr(module, name, None)
                reset.append(path)
        return reset

    def changes(self) -> list[str]:
        """Paths bound differently now than in the snapshot (empty: nothing leaked)."""
        import builtins

        now = self._take()
        changed = []
        for path, old in self.entries.items():
            new = now.get(path, _MISSING)
            if isinstance(old, _Contents) and isinstance(new, _Contents):
                if not old.same(new):
                    changed.append(path)
            elif old is not new:
                changed.append(path)
        added = now.keys() - self.entries.keys()
        shadows = []
        for path in added:
            owner, _, name = path.rpartition(".")
            if isinstance(now.get(owner), type(sys)) and not name.startswith("__") and hasattr(builtins, name):
                shadows.append(path)
        changed.extend(sorted(shadows))
        if not changed:
            self.entries.update((p, now[p]) for p in added)
        return changed


def _scenario_from_json(data: dict):
    from sglfix.scenario import Scenario

    if hasattr(Scenario, "from_json"):
        return Scenario.from_json(data)
    from sglfix.scenario import ModelShape, SpecShape

    data = dict(data)
    data["model"] = ModelShape(**data["model"])
    data["spec"] = SpecShape(**data["spec"])
    for key in ("prefix_lens", "extend_lens", "accept_lens", "capture_bs"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return Scenario(**data)


def _frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    fr = frames[-1]
    return f"{os.path.basename(fr.filename)}:{fr.lineno} in {fr.name}"


class Session:
    """One worker's state between requests: the toggle set it holds and the clean snapshot."""

    def __init__(self, *, device: str, allowed_prefixes: tuple[str, ...] | None) -> None:
        self.device = device
        self.allowed_prefixes = allowed_prefixes
        self.held = None  # the Reverted of the current set, if it reverts anything
        self.current: list[str] | None = None  # None: nothing applied yet, or the last apply failed
        self.clean = StateSnapshot()

    def handle(self, request: dict) -> dict:
        """The reply to one request; never raises for a failure of a cell."""
        rid = request.get("id")
        toggles = [str(t) for t in request.get("toggles") or []]
        scenario_data = request.get("scenario") or {}
        name = str(scenario_data.get("name", "?"))
        try:
            scenario = _scenario_from_json(scenario_data)
        except Exception as exc:
            return self._error(rid, name, toggles, f"sglfix failed to read the scenario: {type(exc).__name__}: "
                                                   f"{_first_line(exc)}", exc)
        if toggles != self.current:
            restart, error = self._switch(toggles)
            if restart:
                return {"id": rid, "restart": restart}
            if error:
                return self._error(rid, name, toggles, error)
        try:
            from sglfix.harness import interpreter
            from sglfix.harness.cell import run_cell

            before = interpreter.stats()
            record = request.get("record")
            unreached = request.get("not_reached")
            if unreached is not None:
                from sglfix.harness.cell import not_reached_result

                result = not_reached_result(name, toggles, device=self.device, same_as=str(unreached["same_as"]),
                                            targets=[str(t) for t in unreached["targets"]])
            elif record is None:
                result = run_cell(scenario, device=self.device, toggles=toggles)
            else:
                result = self._run_recording(scenario, toggles, [str(t) for t in record])
            if interpreter.installed():
                after = interpreter.stats()
                result.kernels = {k: after[k] - before[k] for k in ("launches", "hits")}
        except Exception as exc:  # run_cell itself failed: the harness, not the code under test
            return self._error(rid, name, toggles, f"sglfix failed: {type(exc).__name__}: {_first_line(exc)} "
                                                   f"[{_frame(exc)}]", exc)
        result.revert_env = os.environ.get(_REVERT_ENV)
        return {"id": rid, "result": result.to_json()}

    def _run_recording(self, scenario: Any, toggles: list[str], record: list[str]) -> Any:
        """The cell, and which of the ``record`` targets it entered (code objects seen by the C
        profiler: the cost of a Python hook on every call is too high for interpreted kernels).
        Lazy module caches start empty, as in a fresh worker, so that first-use code paths run."""
        import cProfile

        from sglfix.harness.cell import run_cell
        from sglfix.toggling.revert import target_code

        codes: dict[Any, str] = {}
        unresolved = []
        for target in record:
            try:
                codes[target_code(target, allowed_prefixes=self.allowed_prefixes)] = target
            except Exception:
                unresolved.append(target)  # counted as entered: its cells run and show what is wrong
        self.clean.reset_lazy()
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            result = run_cell(scenario, device=self.device, toggles=toggles)
        finally:
            profiler.disable()
        entered = {e.code for e in profiler.getstats() if not isinstance(e.code, str)}
        result.reached = sorted({codes[c] for c in entered if c in codes} | set(unresolved))
        return result

    def _switch(self, toggles: list[str]) -> tuple[str | None, str | None]:
        """Restore the held set, check nothing of it stayed behind, apply the next one.
        Returns (why this worker must be replaced, why the set cannot be applied)."""
        from sglfix.toggling.env import ENV_VAR, maybe_revert_pr_fix

        if self.held is not None:
            held, self.held = self.held, None
            try:
                held.restore()
            except Exception as exc:
                return f"restoring {','.join(held.ids)} failed: {_first_line(exc)}", None
        self.current = None
        self.clean.reset_lazy()
        changed = self.clean.changes()
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            return f"state of the code under test changed since the worker started: {', '.join(changed[:3])}{more}", None
        os.environ[ENV_VAR] = ",".join(toggles) if toggles else "0"
        try:
            self.held = maybe_revert_pr_fix(allowed_prefixes=self.allowed_prefixes)
        except Exception as exc:
            os.environ[ENV_VAR] = "0"
            return None, f"revert {','.join(toggles)} failed: {_first_line(exc)}"
        self.current = list(toggles)
        return None, None

    def _error(self, rid: Any, name: str, toggles: list[str], message: str, exc: BaseException | None = None) -> dict:
        result = CellResult(scenario=name, toggles=toggles, device=self.device)
        data: dict[str, Any] = {}
        if exc is not None:
            data = {"type": type(exc).__name__, "frame": _frame(exc),
                    "traceback": "".join(traceback.format_exception(exc))[-4000:]}
        result.add("ERROR", message, **data)
        result.revert_env = os.environ.get(_REVERT_ENV)
        return {"id": rid, "result": result.finish().to_json()}


def _check(argv: list[str]) -> None:
    """``python -m sglfix.execution.worker --check [--device D]``: boot once, print what it found."""
    device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else "auto"
    print(json.dumps(_boot(device)))


def serve() -> None:
    """The worker's loop (``python -P -m sglfix.execution.worker``)."""
    global _CHANNEL
    raw = os.environ.pop(_SPEC_ENV, None)
    if raw is None:
        _check(sys.argv[1:])
        return
    spec = json.loads(raw)
    read_fd, write_fd = spec["fds"]
    for fd in (read_fd, write_fd):
        os.set_inheritable(fd, False)
    _die_with_parent(spec["parent"])
    _guard_group(read_fd, write_fd)
    _CHANNEL = channel = _Channel(read_fd, write_fd)
    try:
        info = _boot(spec["device"])
    except ConfigError as exc:
        channel.send({"fatal": _first_line(exc)})
        sys.exit(2)
    channel.send({"ready": info})
    session = Session(device=info["device"], allowed_prefixes=tuple(spec["allowed_prefixes"])
                      if spec.get("allowed_prefixes") is not None else None)
    for request in channel.requests():
        reply = session.handle(request)
        channel.send(reply)
        if "restart" in reply:
            return


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------

_LIVE: set["Worker"] = set()  # workers with a process, killed at interpreter exit
_IDS = itertools.count(1)


@atexit.register
def _kill_live() -> None:
    for worker in list(_LIVE):
        worker.kill(wait=1.0)


@dataclass
class Event:
    """What a worker reported: ready, reply, restart, died, timeout, start_failed, config_error."""

    kind: str
    data: Any = None


def _exit_how(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _crash_site(tail: str) -> str | None:
    """The innermost frame of a faulthandler dump (``Fatal Python error``), under test if any."""
    if "Fatal Python error" not in tail:
        return None
    dump = tail.rsplit("Fatal Python error", 1)[1]
    dump = dump.split("Current thread", 1)[-1]  # other threads' stacks come first
    frames = [line.strip() for line in dump.splitlines() if line.strip().startswith('File "')]
    if not frames:
        return None
    pick = next((f for f in frames if "/backends/" in f), frames[0])
    try:
        path, rest = pick[len('File "'):].split('"', 1)
        return f"{os.path.basename(path)}{rest.replace(', line ', ':', 1)}"
    except ValueError:
        return pick


class Worker:
    """Parent-side handle of one worker process; restartable, never blocks without a bound.

    The pool drives several handles from one select loop (``fds``/``service``/``send``);
    ``run`` is the blocking form for a single worker.
    """

    def __init__(self, config: WorkerConfig | None = None, *, device: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.config = config if config is not None else WorkerConfig(device=device or "cpu")
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.state = "down"  # down, starting, idle, busy
        self.info: dict | None = None
        self.toggles: tuple[str, ...] | None = None  # the set last sent: what the worker holds
        self.pending: dict | None = None  # the request in flight
        self.pids: list[int] = []  # every process this handle started
        self.restarts = 0  # deaths, timeouts and replacements: each costs a fresh process
        self.discarded = 0  # replies whose id matched no request
        self._req = self._rep = self._out = self._pidfd = -1
        self._reply_buf = b""
        self._tail = b""
        self._inbox: list[dict] = []
        self._deadline = math.inf

    # -- process ------------------------------------------------------------------------------

    def _env(self, read_fd: int, write_fd: int) -> dict[str, str]:
        import sglfix

        env = dict(os.environ)
        env.update(self.extra_env)
        env.pop(_REVERT_ENV, None)  # the worker sets it per toggle set
        if self.config.toggles_dir is not None:
            env[_TOGGLES_ENV] = self.config.toggles_dir
        if self.config.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"  # the output tail must be current when the worker dies
        env["PYTHONFAULTHANDLER"] = "1"  # a segfault then names its frame in that tail
        # The worker must run the very sglfix this process runs, whatever the current directory
        # holds: no implicit cwd on sys.path (-P), this package's parent first.
        home = os.path.dirname(os.path.dirname(os.path.abspath(sglfix.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH", "")) if p)
        env[_SPEC_ENV] = json.dumps({
            "fds": [read_fd, write_fd], "parent": os.getpid(), "device": self.config.device,
            "allowed_prefixes": list(self.config.allowed_prefixes) if self.config.allowed_prefixes is not None else None,
        })
        return env

    def start(self) -> None:
        """Launch the process; returns at once (the handshake arrives through ``service``)."""
        if self.proc is not None:
            return
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "sglfix.execution.worker"], stdin=subprocess.DEVNULL,
                stdout=out_w, stderr=out_w, env=self._env(req_r, rep_w), pass_fds=(req_r, rep_w),
                start_new_session=True,
            )
        except BaseException:
            for fd in (req_w, rep_r, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, rep_w, out_w):
                os.close(fd)
        _LIVE.add(self)
        self.pids.append(self.proc.pid)
        self._req, self._rep, self._out = req_w, rep_r, out_r
        os.set_blocking(rep_r, False)
        os.set_blocking(out_r, False)
        try:  # readable when the process exits: death is seen at once, not at the next tick
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = -1
        self._reply_buf, self._tail, self._inbox = b"", b"", []
        self.state, self.info, self.toggles, self.pending = "starting", None, None, None
        self._deadline = time.monotonic() + STARTUP_TIMEOUT

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def signal_kill(self) -> None:
        """SIGKILL to the worker's whole process group (the children of the code under test too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, *, wait: float = KILL_WAIT) -> None:
        """Kill the process group, reap the worker (bounded), close the pipes."""
        if self.proc is None:
            return
        self.signal_kill()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._req, self._rep, self._out, self._pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._rep = self._out = self._pidfd = -1
        self.proc = None
        self.state = "down"
        self.toggles = None
        self._deadline = math.inf
        _LIVE.discard(self)

    close = kill

    # -- I/O ----------------------------------------------------------------------------------

    def fds(self) -> list[int]:
        return [fd for fd in (self._rep, self._out, self._pidfd) if fd >= 0]

    @property
    def deadline(self) -> float:
        return self._deadline

    def output_tail(self) -> str:
        return self._tail.decode(errors="replace")

    def _read(self, fd: int) -> tuple[bytes, bool]:
        """What is there to read now, and whether the pipe reached EOF."""
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return b"".join(chunks), False
            except OSError:
                return b"".join(chunks), True
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)

    def _pump(self) -> None:
        # A pipe at EOF leaves the poll set: it would report a hang-up on every poll, a busy loop
        # (the worker may close its stdout while it runs; death is seen from the process).
        if self._out >= 0:
            data, eof = self._read(self._out)
            if data:
                self._tail = (self._tail + data)[-TAIL_BYTES:]
            if eof:
                os.close(self._out)
                self._out = -1
        if self._rep >= 0:
            data, eof = self._read(self._rep)
            self._reply_buf += data
            *lines, self._reply_buf = self._reply_buf.split(b"\n")
            for line in lines:
                if line.strip():
                    try:
                        self._inbox.append(json.loads(line))
                    except ValueError:
                        self.discarded += 1
            if eof:
                os.close(self._rep)
                self._rep = -1

    def _next_message(self) -> Event | None:
        while self._inbox:
            message = self._inbox.pop(0)
            if not isinstance(message, dict):
                self.discarded += 1
                continue
            if "ready" in message and self.state == "starting":
                self.state, self.info, self._deadline = "idle", message["ready"], math.inf
                return Event("ready", self.info)
            if "fatal" in message and self.state == "starting":
                self.kill()
                return Event("config_error", message["fatal"])
            if self.pending is not None and "id" in message and message["id"] == self.pending["id"]:
                self.pending, self.state, self._deadline = None, "idle", math.inf
                if "restart" in message:
                    return Event("restart", message["restart"])
                return Event("reply", message.get("result"))
            self.discarded += 1  # a stale or forged reply: never attributed to a cell
        return None

    def service(self, *, now: float | None = None) -> Event | None:
        """Read what arrived, then report one event (call again until None)."""
        if self.proc is None:
            return None
        self._pump()
        event = self._next_message()
        if event is not None or self.proc is None:
            return event
        if self.proc.poll() is not None:
            return self._died()
        now = time.monotonic() if now is None else now
        if now >= self._deadline:
            if self.state == "starting":
                self.kill()
                return Event("start_failed", f"worker failed to start: no handshake within {STARTUP_TIMEOUT:g} s; {_CHECK_HINT}")
            if self.state == "busy":
                limit = self.pending["timeout"]
                self.restarts += 1
                self.pending = None
                self.kill()
                return Event("timeout", limit)
        return None

    def _died(self) -> Event:
        self._pump()  # whatever it wrote before dying
        code = self.proc.returncode
        tail = self.output_tail()
        was, pending = self.state, self.pending
        self.pending = None
        self.kill(wait=1.0)  # reaps nothing new; kills the children it left behind
        if was == "starting":
            last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "no output")
            return Event("start_failed", f"worker failed to start ({_exit_how(code)}): {last}; {_CHECK_HINT}")
        self.restarts += 1
        return Event("died", {"returncode": code, "tail": tail, "pending": pending is not None})

    def send(self, *, scenario_json: dict, toggles: Any, timeout: float | None = None,
             extra: dict | None = None) -> int:
        """Send one cell to an idle worker; returns the request id. ``extra``: more request
        keys (``record``: target paths whose entry the cell reports; ``not_reached``: apply the
        set, then answer NOT_REACHED without running)."""
        assert self.state == "idle", self.state
        rid = next(_IDS)
        limit = timeout if timeout is not None else self.config.timeout
        self.pending = {"id": rid, "timeout": limit}
        self.state = "busy"
        self.toggles = tuple(toggles)
        self._deadline = time.monotonic() + limit
        request = {"id": rid, "toggles": list(toggles), "scenario": scenario_json}
        request.update(extra or {})
        data = (json.dumps(request) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._req, view):]
        except OSError:
            pass  # it died: service() reports it with this request pending
        return rid

    # -- results ------------------------------------------------------------------------------

    def result_for(self, event: Event, *, scenario: str, toggles: Any) -> CellResult:
        """The CellResult an event stands for (FAULT, TIMEOUT, or the worker's own reply)."""
        device = (self.info or {}).get("device", self.config.device)
        if event.kind == "reply":
            return CellResult.from_json(event.data)
        result = CellResult(scenario=scenario, toggles=list(toggles), device=device)
        if event.kind == "timeout":
            result.add("TIMEOUT", f"no result within {event.data:g} s; worker restarted", timeout_s=event.data)
        elif event.kind == "died":
            code, tail = event.data["returncode"], event.data["tail"]
            site = _crash_site(tail)
            if site:
                what = f"at {site}"
            else:
                what = " | ".join(line.strip() for line in tail.strip().splitlines()[-3:]) or "no output"
            result.add("FAULT", f"worker died ({_exit_how(code)}): {what}", returncode=code, output_tail=tail[-2000:])
        else:
            result.add("ERROR", f"sglfix failed: unexpected worker event {event.kind}: {event.data}")
        return result.finish()

    def wait_event(self, *, until: float) -> Event | None:
        """Block (bounded by ``until``) for this worker's next event."""
        while True:
            event = self.service()
            if event is not None or self.proc is None:
                return event
            now = time.monotonic()
            left = min(until, self._deadline) - now
            if now >= until:
                return None
            wait_fds(self.fds(), timeout=max(0.0, min(left, 0.5)))

    def wait_ready(self) -> None:
        """Start if needed and wait for the handshake; raise if the worker cannot start."""
        if self.state == "down":
            self.start()
        while self.state == "starting":
            event = self.wait_event(until=math.inf)
            if event is not None:
                raise_for_start(event)

    def run(self, *, scenario_json: dict, scenario_name: str, toggles: Any, timeout: float | None = None,
            extra: dict | None = None) -> CellResult:
        """Run one cell and wait for its result; restarts the worker after a fault or timeout."""
        for _ in range(3):
            self.wait_ready()
            self.send(scenario_json=scenario_json, toggles=toggles, timeout=timeout, extra=extra)
            while True:
                event = self.wait_event(until=math.inf)
                if event is None or event.kind == "ready":
                    continue
                if event.kind == "restart":
                    self.kill()
                    self.restarts += 1
                    break
                if event.kind == "died" and not event.data["pending"]:
                    break
                return self.result_for(event, scenario=scenario_name, toggles=toggles)
        result = CellResult(scenario=scenario_name, toggles=list(toggles), device=self.config.device)
        result.add("ERROR", "sglfix failed: the worker kept asking to be replaced before this cell could run")
        return result.finish()


def raise_for_start(event: Event) -> None:
    if event.kind == "start_failed":
        raise WorkerStartError(event.data)
    if event.kind == "config_error":
        raise ConfigError(event.data)


def wait_fds(fds: list[int], *, timeout: float) -> list[int]:
    """The fds that are readable (or hung up) within ``timeout`` seconds; no FD_SETSIZE limit."""
    if not fds:
        time.sleep(timeout)
        return []
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        return [fd for fd, _ in poller.poll(timeout * 1000.0)]
    except InterruptedError:
        return []


if __name__ == "__main__":
    serve()
