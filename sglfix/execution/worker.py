"""Long-lived worker processes that run cells: the parent-side handle (``Worker``).

A fresh process that imports torch and initialises CUDA costs seconds, so a worker runs many
cells and is replaced only after a fault, a timeout, or when a toggle set left state behind.
The process itself is ``sglfix.execution.serve`` (``python -P -m sglfix.execution.serve``); what
it does with one request is ``sglfix.execution.session``.

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
from dataclasses import dataclass
from typing import Any

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError, SglfixError
from sglfix.harness.result import CellResult

__all__ = ["Event", "Worker", "WorkerConfig", "WorkerStartError"]

DEVICES = ("auto", "cpu", "cuda")
STARTUP_TIMEOUT = 300.0  # importing torch, initialising CUDA, importing the backends
KILL_WAIT = 5.0  # after SIGKILL only a process stuck in the kernel outlives this
TAIL_BYTES = 16384
_CHECK_HINT = "check the install with: python -m sglfix.execution.serve --check"


class WorkerStartError(SglfixError):
    """A worker process could not even start (import error, broken install)."""


# Candidate fixes beyond this many bytes travel in a file, not in the environment (a mutation
# campaign's thousands of mutant diffs exceed what exec accepts).
_INLINE_CANDIDATES = 64 * 1024
_CANDIDATE_FILES: dict[str, str] = {}


def _remove_if_there(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)


def _candidates_spec(candidates: Any) -> dict:
    """The candidates as a worker's start-up spec holds them: inline, or the path of a file the
    parent keeps until it exits (one per set of candidates, shared by every worker of a pool)."""
    rows = [list(c) for c in candidates]
    text = json.dumps(rows)
    if len(text) <= _INLINE_CANDIDATES:
        return {"candidates": rows}
    import hashlib

    key = hashlib.sha256(text.encode()).hexdigest()
    path = _CANDIDATE_FILES.get(key)
    if path is None or not os.path.exists(path):
        import atexit
        import tempfile

        fd, path = tempfile.mkstemp(prefix="sglfix-candidates-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        atexit.register(_remove_if_there, path)
        _CANDIDATE_FILES[key] = path
    return {"candidates_file": path}


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs; every worker of a pool gets all of it."""

    device: str
    toggles_dir: str | None = None
    allowed_prefixes: tuple[str, ...] | None = None
    timeout: float = 300.0
    codebase: str = "reproduction"  # what the cells replay through (sglfix.codebases)
    # Where the profiles were found (SGLFIX_PROFILES_PATH), fixed when the config is made: a Ray
    # actor on another node, whose environment is not this process's, must find the same record.
    profiles_path: str | None = None
    # The engine package the code base is (None: the reproduction), resolved with the config.
    engine_package: str | None = None
    # Candidate fixes (--apply) a toggle set may hold: (id, diff text, sha256) each. The text
    # travels, not the path: a Ray actor on another node has no such file.
    candidates: tuple[tuple[str, str, str], ...] = ()
    # Each cell also reports what the result store keys its result on (the files it ran).
    deps: bool = False
    # Each cell also reports digests of the metadata it built and its output (sglfix mutate).
    fingerprint: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"--device {self.device!r} is not one of auto, cpu, cuda")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            if isinstance(t, float) and math.isinf(t):
                shown = ": the value is too large to be a number of seconds"
            else:
                shown = f" {t:g}" if isinstance(t, (int, float)) and not isinstance(t, bool) else f" {t!r}"
            raise ConfigError(f"--timeout{shown}: must be a finite number of seconds > 0; pass e.g. --timeout 300")
        if self.toggles_dir is not None:
            path = os.path.abspath(os.fspath(self.toggles_dir))
            if not os.path.isdir(path):
                raise ConfigError(f"toggles directory {path} does not exist; pass an existing --toggles DIR")
            object.__setattr__(self, "toggles_dir", path)
        if self.allowed_prefixes is not None:
            object.__setattr__(self, "allowed_prefixes", tuple(str(p) for p in self.allowed_prefixes))
        from sglfix.codebases import get_codebase

        if self.profiles_path is None:
            object.__setattr__(self, "profiles_path", envs.SGLFIX_PROFILES_PATH.get() or "")
        cb = get_codebase(self.codebase)
        object.__setattr__(self, "engine_package", None if cb.is_reproduction else cb.package)


def _engine_first(package: str | None, home: str) -> tuple[str, ...]:
    """The folders a worker's ``PYTHONPATH`` starts with: the one this process imports the code
    base's ``package`` from, then sglfix's own. sglfix's folder of a regular install is
    site-packages, which also holds the engine's wheel: put first alone, it would shadow a source
    tree the user put on ``PYTHONPATH``, and the workers would run other code than was resolved."""
    from sglfix.common.codebase import package_dir

    found = package_dir(package) if package else None
    root = os.path.dirname(found) if found else None
    if root is None or os.path.realpath(root) == os.path.realpath(home):
        return (home,)
    if os.path.exists(os.path.join(root, "sglfix")):
        # Another sglfix beside the engine: this one must still be the one that runs.
        return (home, root)
    return (root, home)


def descendants(root: int) -> list[int]:
    """Every process below ``root``, by parent pid from ``/proc`` (empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                data = fh.read()
            ppid = int(data[data.rindex(b")") + 2 :].split()[1])  # "pid (comm) state ppid ..."
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------

_LIVE: set[Worker] = set()  # workers with a process, killed at interpreter exit
_IDS = itertools.count(1)


@atexit.register
def _kill_live() -> None:
    for worker in list(_LIVE):
        worker.kill(wait=1.0)


@dataclass
class Event:
    """What a worker reported: ready, reply, lost (a reply whose cell left the GPU context
    unusable: the worker ends after it), idle, restart, died, timeout, start_failed, config_error."""

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
        path, rest = pick[len('File "') :].split('"', 1)
        return f"{os.path.basename(path)}{rest.replace(', line ', ':', 1)}"
    except ValueError:
        return pick


class Worker:
    """Parent-side handle of one worker process; restartable, never blocks without a bound.

    The pool drives several handles from one select loop (``fds``/``service``/``send``);
    ``run`` is the blocking form for a single worker.
    """

    def __init__(
        self, config: WorkerConfig | None = None, *, device: str | None = None, extra_env: dict[str, str] | None = None
    ) -> None:
        self.config = config if config is not None else WorkerConfig(device=device or "cpu")
        self.extra_env = dict(extra_env or {})
        self.started_env: dict[str, str] = {}
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
        self.started_env = dict(self.extra_env)  # what the running process got (extra_env may change)
        env = dict(os.environ)
        env.update(self.extra_env)
        envs.REVERT_PR.unset(env=env)  # the worker sets it per toggle set
        envs.SGLFIX_APPLY.unset(env=env)  # and this one too
        if self.config.toggles_dir is not None:
            envs.SGLFIX_TOGGLES_DIR.set(self.config.toggles_dir, env=env)
        if self.config.profiles_path:
            envs.SGLFIX_PROFILES_PATH.set(self.config.profiles_path, env=env)
        if self.config.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"  # the output tail must be current when the worker dies
        env["PYTHONFAULTHANDLER"] = "1"  # a segfault then names its frame in that tail
        # The worker must run the very sglfix this process runs, whatever the current directory
        # holds: no implicit cwd on sys.path (-P), this package's parent first.
        home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above sglfix/execution/
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (*_engine_first(self.config.engine_package, home), env.get("PYTHONPATH", "")) if p
        )
        env[envs.SGLFIX_WORKER.name] = json.dumps(
            {
                "fds": [read_fd, write_fd],
                "parent": os.getpid(),
                "device": self.config.device,
                "codebase": self.config.codebase,
                "allowed_prefixes": list(self.config.allowed_prefixes)
                if self.config.allowed_prefixes is not None
                else None,
                **_candidates_spec(self.config.candidates),
                "deps": self.config.deps,
            }
        )
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
                [sys.executable, "-P", "-m", "sglfix.execution.serve"],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                env=self._env(req_r, rep_w),
                pass_fds=(req_r, rep_w),
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
        """SIGKILL to the worker's whole process group (the children of the code under test too),
        and to every other process below the worker: one the code under test started in a
        session of its own is in no group of ours (the worker is their subreaper, so even a
        double-forked one stays below it)."""
        if self.proc is None:
            return
        escaped = descendants(self.proc.pid)  # read before the group dies and they are reparented
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in escaped:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def retire(self) -> None:
        """Stop this process so that the next cell starts a fresh one (it asked to be replaced,
        or its GPU context is gone); counted among ``restarts``."""
        self.kill()
        self.restarts += 1

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
        chunks: list[bytes] = []
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
                if "idle" in message:
                    return Event("idle", message["idle"])
                if "lost" in message:
                    return Event("lost", {"result": message.get("result"), "why": message["lost"]})
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
                return Event(
                    "start_failed",
                    f"worker failed to start: no handshake within {STARTUP_TIMEOUT:g} s; {self._pins_said()}{_CHECK_HINT}",
                )
            if self.state == "busy":
                assert self.pending is not None  # busy: a request is in flight
                limit = self.pending["timeout"]
                self.restarts += 1
                self.pending = None
                self.kill()
                return Event("timeout", limit)
        return None

    def _pins_said(self) -> str:
        """An exact pin of the engine's that this environment does not hold, as the likely cause of
        a worker that could not start (``sglfix.codebases.pins``), ending in "; " ("": none)."""
        try:
            from sglfix.codebases import get_codebase, installed
            from sglfix.codebases.pins import pin_mismatch

            cb = get_codebase(self.config.codebase)
            said = None if cb.is_reproduction else pin_mismatch(cb, installed(cb))
        except Exception:  # the diagnosis must never hide the failure it explains
            return ""
        return f"{said}; " if said else ""

    def _died(self) -> Event:
        self._pump()  # whatever it wrote before dying
        assert self.proc is not None  # only a started worker dies
        code = self.proc.returncode
        tail = self.output_tail()
        was, pending = self.state, self.pending
        self.pending = None
        self.kill(wait=1.0)  # reaps nothing new; kills the children it left behind
        if was == "starting":
            last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "no output")
            return Event(
                "start_failed", f"worker failed to start ({_exit_how(code)}): {last}; {self._pins_said()}{_CHECK_HINT}"
            )
        self.restarts += 1
        return Event("died", {"returncode": code, "tail": tail, "pending": pending is not None})

    def send(
        self, *, scenario_json: dict, toggles: Any, timeout: float | None = None, extra: dict | None = None
    ) -> int:
        """Send one cell to an idle worker; returns the request id. ``extra``: more request
        keys (``record``: target paths whose entry the cell reports; ``not_reached``: apply the
        set, then answer NOT_REACHED without running)."""
        assert self.state == "idle", self.state
        self.toggles = tuple(toggles)
        request = {"toggles": list(toggles), "scenario": scenario_json, **(extra or {})}
        if self.config.deps:
            request.setdefault("deps", True)
        if self.config.fingerprint:
            request.setdefault("fingerprint", True)
        return self._request(request, timeout=timeout if timeout is not None else self.config.timeout)

    def _request(self, request: dict, *, timeout: float) -> int:
        """Send one request to the idle worker, pending until its reply or ``timeout`` seconds."""
        rid = next(_IDS)
        self.pending, self.state = {"id": rid, "timeout": timeout}, "busy"
        self._deadline = time.monotonic() + timeout
        data = (json.dumps({"id": rid, **request}) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._req, view) :]
        except OSError:
            pass  # it died: service() reports it with this request pending
        return rid

    def idle(self, *, timeout: float = 60.0) -> dict | None:
        """Between runs: the worker gives back the device memory its allocator caches, so that a
        worker kept warm (``--ray-keep``) starts the next run holding what a fresh one would.
        What it then holds; None when it was not up, or did not answer (then it is stopped and
        the next cell starts a fresh one)."""
        if self.state != "idle":
            return None
        self._request({"idle": True}, timeout=timeout)
        while True:
            event = self.wait_event(until=math.inf)
            if event is None:
                continue
            if event.kind == "idle":
                return event.data
            if self.proc is not None:
                self.kill()
            return None

    # -- results ------------------------------------------------------------------------------

    def result_for(self, event: Event, *, scenario: str, toggles: Any) -> CellResult:
        """The CellResult an event stands for (FAULT, TIMEOUT, or the worker's own reply)."""
        device = (self.info or {}).get("device", self.config.device)
        if event.kind == "reply":
            return CellResult.from_json(event.data)
        if event.kind == "lost":
            return CellResult.from_json(event.data["result"])
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

    def run(
        self,
        *,
        scenario_json: dict,
        scenario_name: str,
        toggles: Any,
        timeout: float | None = None,
        extra: dict | None = None,
    ) -> CellResult:
        """Run one cell and wait for its result; restarts the worker after a fault or timeout."""
        for _ in range(3):
            self.wait_ready()
            self.send(scenario_json=scenario_json, toggles=toggles, timeout=timeout, extra=extra)
            while True:
                event = self.wait_event(until=math.inf)
                if event is None or event.kind == "ready":
                    continue
                if event.kind == "restart":
                    self.retire()
                    break
                if event.kind == "died" and not event.data["pending"]:
                    break
                if event.kind == "lost":  # its own fault (no one shares this worker's context)
                    self.retire()
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
