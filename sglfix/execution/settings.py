"""How a command that runs cells wants them run: one model for ``run``, ``matrix`` and ``bisect``
(and anything else that runs cells through ``sglfix.execution.runner``), built once from the
command line and checked once by the runner before any worker starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# ``record`` naming every function of the code base (``report finding``, ``mutate``), not targets.
EVERY_FUNCTION = "*"


class Settings(BaseModel):
    """Where and how cells run. Each field is an option of the commands that run cells; a value
    is checked against the machine and the code base by ``sglfix.execution.runner.prepare``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: tuple[str, ...] = ()  # name globs (-s)
    scenario_file: tuple[str, ...] = ()  # scenario files replacing the built-in set
    backend: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    jobs: int | None = None
    timeout: float = 300.0
    memory_budget: str | None = None
    devices: str | None = None  # one worker per listed GPU
    executor: str = "local"  # local or ray: checked with a one-line error, as every other value
    mps: str = "auto"  # auto, on or off: local workers sharing a GPU through a private MPS daemon
    ray_address: str | None = None
    ray_keep: float | None = None
    shard: str | None = None  # I/N
    shard_costs: str | None = None  # a report whose cell timings balance the shards
    reachability: bool = False  # run the baseline first; cells it shows unreached are NOT_REACHED
    env_baseline: bool | None = None  # None: a run (its reverts add to the variable's by design)
    record: tuple[str, ...] = ()  # functions whose entry each cell records (run --reach-file)
    cache: str | None = None  # the result store's folder (None: the default one)
    no_cache: bool = False  # neither read nor write the result store
    verify_store: int = 0  # served cells run again fresh, any difference a failure
    fingerprint: bool = False  # each cell also digests the metadata it built and its output (mutate)

    @classmethod
    def of(cls, given: Mapping[str, Any], **fixed: Any) -> Settings:
        """The settings among a command's parsed options ``given`` (the others are the
        command's own), with ``fixed`` values the command decides itself."""
        values = {k: v for k, v in given.items() if k in cls.model_fields}
        values.update(fixed)
        for name in ("scenario", "scenario_file"):
            if name in values:
                values[name] = tuple(values[name] or ())
        return cls(**values)
