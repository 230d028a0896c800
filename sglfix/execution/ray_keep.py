"""Kept Ray actors: a run joined to a cluster leaves its actors there, idle, for the next run.

A fresh actor costs seconds before its first cell: a Ray worker process, then the sglfix worker
(torch, CUDA, the code base), then each kernel's first use. With ``--ray-keep SECONDS`` the
actors of a run joined to a cluster (``--ray-address``) are detached and named in the ``sglfix``
namespace; when the run ends they stay, idle, for that long, and a later run of the same identity
claims them instead of starting its own.

Never stale. An actor's name carries its identity: the worker config, the Ray resources it holds,
the Python and package versions, and the content of sglfix (its reproduction, toggles, scenarios
and profiles) and of the toggles directory. When a run claims it, the actor computes its identity
again and checks that the files its worker was booted from (those, and the code base's package,
by size and modification time) are still what its node has; otherwise it refuses, stops its
worker and exits, and the run starts a fresh actor.

Never in the way. On being given back, the worker gives its allocator's cached device memory back
(``Worker.idle``): an idle kept worker holds its CUDA context and compiled kernels, not a cache
sized for the last run's cells, and the next run starts from what a fresh worker would hold. A run
that must start actors for which the cluster has no free resources first stops idle kept actors of
other identities, longest idle first, instead of waiting for their keep time to run out.

Never leaked. An idle actor exits after its keep time. One claimed by a run that stopped calling
it (its driver was killed) counts as given back after ``HOLD_S`` without a call. A run that ends
on an error or a signal kills its actors instead of keeping them. ``sglfix ray-workers`` lists
and stops them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

import ray

from sglfix.execution.ray_actor import CellActor
from sglfix.execution.worker import WorkerConfig

__all__ = [
    "HOLD_S",
    "NAMESPACE",
    "Keeper",
    "KeptActor",
    "answers",
    "disk_state",
    "identity",
    "kept_actors",
]

NAMESPACE = "sglfix"
PREFIX = "sglfix-worker-"
# A claimed actor that has had no call for this long (and runs none) is free again: its run's
# driver died without giving it back. Longer than any pause of a live run between calls.
HOLD_S = 600.0
_TICK = 0.25
_CLAIM_WAIT = 30.0
_RAY_NAMES = {"num_gpus": "GPU", "num_cpus": "CPU"}  # an actor's resource options as Ray counts them
_PACKAGES = ("torch", "triton", "flashinfer-python", "sglang", "ray", "pydantic", "PyYAML")
_SGLFIX_PACKAGES = ("sglfix", "sglfix.backends", "sglfix.toggles", "sglfix.scenarios", "sglfix.profiles")


def _package_dirs(names: tuple[str, ...]) -> list[str]:
    """The directories of these packages, found without importing them, nested ones left out.
    A package's own directory (its ``__init__``'s), not its whole search path: run from a source
    checkout, sglfix's path also holds the checkout's root (``sglfix._source_checkout_layout``),
    and the tests, benchmarks and caches there are not what a worker runs."""
    dirs: list[str] = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.origin and os.path.basename(spec.origin).startswith("__init__."):
            dirs.append(os.path.realpath(os.path.dirname(spec.origin)))
            continue
        for d in spec.submodule_search_locations or ():  # a namespace package: every part
            dirs.append(os.path.realpath(d))
    dirs = sorted(set(dirs))
    return [d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs)]


def _digest(roots: list[str], *, content: bool) -> str:
    """Every file under ``roots`` but bytecode: its content, or (``content=False``, for a tree of
    thousands of files) its size and modification time."""
    h = hashlib.sha256()
    for n, root in enumerate(roots):
        h.update(f"root {n}\0".encode())
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if content:
                        with open(path, "rb") as fh:
                            data = fh.read()
                    else:
                        st = os.stat(path)
                        data = f"{st.st_size}:{st.st_mtime_ns}".encode()
                except OSError:
                    data = b"unreadable"
                h.update(os.path.relpath(path, root).encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def identity(config: WorkerConfig, resources: dict) -> str:
    """What a kept actor must match to be claimed; the same on every node that has the same
    install (content, not paths or times)."""
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    doc = {
        "config": dataclasses.asdict(config),
        "resources": resources,
        "python": sys.version,
        "versions": versions,
        "sglfix": _digest(_package_dirs(_SGLFIX_PACKAGES), content=True),
        "toggles": _digest([config.toggles_dir] if config.toggles_dir else [], content=True),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:20]


def disk_state(config: WorkerConfig) -> str:
    """The files a worker of ``config`` imports or reads, as this node has them now."""
    from sglfix.codebases import get_codebase

    top = get_codebase(config.codebase).package.split(".")[0]
    roots = _package_dirs((*_SGLFIX_PACKAGES, top))
    if config.toggles_dir:
        roots.append(config.toggles_dir)
    return _digest(roots, content=False)


class KeptActor(CellActor):
    """A ``CellActor`` that a run claims, gives back, and that exits on its own once idle."""

    def __init__(self, config: WorkerConfig, *, key: str, resources: dict, keep_s: float, owner: str) -> None:
        # Taken before the worker imports anything: an edit made after shows as a change.
        self._state = disk_state(config)
        self._reusable = identity(config, resources) == key  # else this node's install differs
        super().__init__(config)
        self.config, self.key, self.resources = config, key, resources
        self.keep_s = keep_s
        self.owner: str | None = owner
        self.busy = 0
        self.last = time.monotonic()
        self.exiting = False
        self.held: dict | None = None  # what the worker holds while idle (Worker.idle)
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, name="sglfix-keep", daemon=True).start()

    def boot(self) -> dict:
        return {**super().boot(), "reusable": self._reusable}

    def run_batch(self, items: list) -> list[dict]:
        with self.lock:
            self.busy += 1
        try:
            return super().run_batch(items)
        finally:
            with self.lock:
                self.busy -= 1
                self.last = time.monotonic()

    @ray.method(concurrency_group="control")
    def claim(self, key: str, owner: str) -> str | None:
        """This actor for ``owner``'s run (None), or why not: in use, exiting, or stale (then
        it exits)."""
        with self.lock:
            if self.exiting:
                return "exiting"
            if self.owner is not None:
                return "in use by another run"
            self.owner = owner  # held while checking: no second run claims it meanwhile
        why = None
        if key != self.key or not self._reusable or identity(self.config, self.resources) != key:
            why = "stale: sglfix, the toggles or the packages changed since it booted"
        elif disk_state(self.config) != self._state:
            why = "stale: files it booted from changed on disk since"
        with self.lock:
            if why is None:
                self.last = time.monotonic()
            else:
                self.owner, self.exiting = None, True
        return why

    @ray.method(concurrency_group="control")
    def release(self, owner: str, keep_s: float) -> bool:
        """Idle from now, for ``keep_s`` seconds (the last run's --ray-keep)."""
        with self.lock:
            if self.owner != owner:
                return False
            busy = self.busy
        # The run is over (its driver has every result): nothing else talks to the worker now.
        self.held = self.worker.idle() if not busy else None
        with self.lock:
            self.owner, self.keep_s, self.last = None, keep_s, time.monotonic()
            return self._reusable

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        with self.lock:
            idle = time.monotonic() - self.last
            return {
                "key": self.key,
                "node": os.uname().nodename,
                "pid": os.getpid(),
                "claimed": self.owner is not None,
                "busy": self.busy > 0,
                "idle_s": round(idle, 1),
                "keep_s": self.keep_s,
                "resources": self.resources,
                "exits_in_s": None if self.owner is not None else round(max(0.0, self.keep_s - idle), 1),
                "toggles_held": list(self.worker.toggles) if self.worker.toggles is not None else None,
                "device_reserved_mib": (self.held or {}).get("device_reserved_mib"),
            }

    @ray.method(concurrency_group="control")
    def stop(self, force: bool) -> bool:
        """Exit now if idle (or ``force``); whether it will."""
        with self.lock:
            if self.owner is not None and not force:
                return False
            self.exiting = True
            return True

    def _watch(self) -> None:
        while True:
            time.sleep(_TICK)
            with self.lock:
                if self.busy:
                    continue
                idle = time.monotonic() - self.last
                if self.owner is not None and idle > HOLD_S:
                    self.owner, self.last, idle = None, time.monotonic(), 0.0
                if self.exiting or (self.owner is None and idle > self.keep_s):
                    self.exiting = True
                    break
        try:
            self.worker.kill()
        finally:
            os._exit(0)


def kept_actors(*, key: str | None = None) -> list[tuple[str, Any]]:
    """(name, handle) of every live kept actor in the cluster this driver joined (of ``key``)."""
    prefix = PREFIX + (f"{key}-" if key else "")
    out = []
    for entry in ray.util.list_named_actors(all_namespaces=True):  # {"name", "namespace"} each
        if entry["namespace"] != NAMESPACE or not entry["name"].startswith(prefix):
            continue
        try:
            out.append((entry["name"], ray.get_actor(entry["name"], namespace=NAMESPACE)))
        except ValueError:  # gone since it was listed
            continue
    return out


def answers(refs: list[Any]) -> list[Any]:
    """The value of each call sent to a kept actor, or the exception it ended in (the actor died
    or exited meanwhile, or gave no answer within ``_CLAIM_WAIT``). The calls are sent together;
    one actor's failure is that actor's answer, never the others'."""
    out: list[Any] = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=_CLAIM_WAIT))
        except Exception as exc:
            out.append(exc)
    return out


class Keeper:
    """The driver's side: claims kept actors of its identity, starts the rest, gives them back."""

    def __init__(self, config: WorkerConfig, resources: dict, keep_s: float) -> None:
        self.config, self.resources, self.keep_s = config, resources, keep_s
        self.key = identity(config, resources)
        self.owner = uuid.uuid4().hex
        self.reused = 0
        self.started = 0
        self.declined: dict[str, int] = {}  # why kept actors of this identity were not taken
        self.evicted = 0  # idle kept actors of other identities stopped to make room
        self._cls = ray.remote(max_restarts=0, max_task_retries=0, concurrency_groups={"control": 1}, **resources)(
            KeptActor
        )

    def claim(self, size: int) -> list[Any]:
        """Up to ``size`` kept actors of this identity, claimed for this run."""
        candidates = kept_actors(key=self.key)
        got: list[Any] = []
        while candidates and len(got) < size:
            batch, candidates = candidates[: size - len(got)], candidates[size - len(got) :]
            for (_, handle), why in zip(batch, answers([h.claim.remote(self.key, self.owner) for _, h in batch])):
                if isinstance(why, Exception):
                    why = f"no answer: {type(why).__name__}"
                if why is None:
                    got.append(handle)
                else:
                    self.declined[why] = self.declined.get(why, 0) + 1
        self.reused += len(got)
        return got

    def make_room(self, count: int) -> None:
        """Before ``count`` new actors: when the cluster has not the resources free for them,
        idle kept actors of other identities (another toggles directory, other options) are
        stopped, longest idle first, until it has. They are a cache: left alone they would hold
        their GPU share until their keep time ran out, and this run would wait for it."""
        need = {_RAY_NAMES[k]: v * count for k, v in self.resources.items() if v}
        free = ray.available_resources()
        short = {k: v - free.get(k, 0.0) for k, v in need.items() if free.get(k, 0.0) + 1e-6 < v}
        if not short:
            return
        others = [(n, h) for n, h in kept_actors() if not n.startswith(f"{PREFIX}{self.key}-")]
        idle = [
            (row["idle_s"], handle, row.get("resources") or {})  # an older sglfix's actor has none
            for (_, handle), row in zip(others, answers([h.status.remote() for _, h in others]))
            if not isinstance(row, Exception) and not row["claimed"]
        ]
        for _, handle, held in sorted(idle, key=lambda r: -r[0]):
            if not short:
                break
            if answers([handle.stop.remote(False)])[0] is not True:
                continue  # a run claimed it meanwhile, or it is gone already
            self.evicted += 1
            for k, v in held.items():
                name = _RAY_NAMES.get(k)
                if name in short:
                    short[name] -= v
            short = {k: v for k, v in short.items() if v > 1e-6}

    def new(self) -> Any:
        self.started += 1
        return self._cls.options(
            name=f"{PREFIX}{self.key}-{uuid.uuid4().hex[:8]}", namespace=NAMESPACE, lifetime="detached"
        ).remote(config=self.config, key=self.key, resources=self.resources, keep_s=self.keep_s, owner=self.owner)

    def give_back(self, actors: list[Any]) -> list[Any]:
        """Each actor idle for the keep time from now; those that cannot be kept (claimed by
        another run meanwhile, an install that differs on their node) are returned to be killed."""
        kept = answers([a.release.remote(self.owner, self.keep_s) for a in actors])
        return [a for a, ok in zip(actors, kept) if ok is not True]

    def info(self) -> dict:
        return {
            "keep_s": self.keep_s,
            "identity": self.key,
            "reused": self.reused,
            "started": self.started,
            "declined": dict(self.declined),
            "evicted": self.evicted,
        }
