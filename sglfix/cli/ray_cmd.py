"""``sglfix ray-workers``: the actors that runs with ``--ray-keep`` left in a Ray cluster, and
stopping them."""

from __future__ import annotations

import typer

from sglfix.cli.context import emit_json, out
from sglfix.common.errors import ConfigError


def ray_workers_cmd(
    ray_address: str = typer.Option(
        ..., "--ray-address", metavar="ADDR", help="The Ray cluster (auto, host:port or ray://head:10001)."
    ),
    stop: bool = typer.Option(False, "--stop", help="Stop the idle ones (a run's claimed ones are left running)."),
    stop_all: bool = typer.Option(False, "--all", help="With --stop: stop the claimed ones too (their cells FAULT)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List (or stop) the sglfix workers kept warm in a Ray cluster by --ray-keep."""
    from sglfix.execution.ray_pool import import_ray, init_ray
    from sglfix.execution.ray_probe import check_ray_address, quiet_ray_logs

    if stop_all and not stop:
        raise ConfigError("--all goes with --stop: give --stop --all to stop every kept worker")
    check_ray_address(ray_address)
    quiet_ray_logs()
    ray = import_ray()
    init_ray(
        ray,
        shown=ray_address,
        address=ray_address,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        rows = _rows(ray, stop=stop, force=stop_all)
    finally:
        ray.shutdown()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no kept sglfix workers in this cluster")
        return
    for r in rows:
        if r.get("gone"):
            out.print(f"{r['name']}  gone (it exited while being asked)")
            continue
        state = "in use by a run" if r["claimed"] else f"idle {r['idle_s']:g} s, exits in {r['exits_in_s']:g} s"
        action = {True: "  -> stopped", False: "  -> left running (in use; --all stops it)"}.get(r.get("stopped"), "")
        out.print(f"{r['name']}  {r['node']} pid {r['pid']}  {state}{action}")


def _rows(ray, *, stop: bool, force: bool) -> list[dict]:
    from sglfix.execution.ray_keep import answers, kept_actors

    actors = kept_actors()
    rows = []
    for (name, handle), status in zip(actors, answers([h.status.remote() for _, h in actors])):
        if isinstance(status, Exception):
            rows.append({"name": name, "gone": True})
            continue
        row = {"name": name, **status}
        if stop:
            stopped = answers([handle.stop.remote(force)])[0]
            row["stopped"] = True if isinstance(stopped, Exception) else bool(stopped)  # an error: it exited
            if row["stopped"] and force:
                ray.kill(handle, no_restart=True)  # a claimed one may be mid-cell: not waited on
        rows.append(row)
    return rows


def register(app: typer.Typer) -> None:
    app.command("ray-workers")(ray_workers_cmd)
