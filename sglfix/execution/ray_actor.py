"""The Ray actor that runs cells: one sglfix worker behind the local ``Worker`` handle.

A module of its own, importing nothing of Ray: the pool (``sglfix.execution.ray_pool``) starts
it as is, and the kept actor (``sglfix.execution.ray_keep``) extends it; Ray finds the class on
each node by this module's path.
"""

from __future__ import annotations

import os

from sglfix.execution.worker import WorkerConfig

__all__ = ["CellActor"]


class CellActor:
    """Lives in a Ray worker process: one sglfix worker behind the local ``Worker`` handle."""

    def __init__(self, config: WorkerConfig) -> None:
        from sglfix.execution.worker import Worker

        self.worker = Worker(config)

    def boot(self) -> dict:
        self.worker.wait_ready()
        return {
            **(self.worker.info or {}),
            "node": os.uname().nodename,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def run(self, scenario_json: dict, scenario_name: str, toggles: list, extra: dict | None) -> dict:
        result = self.worker.run(
            scenario_json=scenario_json, scenario_name=scenario_name, toggles=tuple(toggles), extra=extra
        )
        return result.to_json()

    def run_batch(self, items: list) -> list[dict]:
        return [self.run(*item) for item in items]

    def pids(self) -> list[int]:
        return [os.getpid(), *self.worker.pids]

    def close(self) -> None:
        self.worker.kill()
