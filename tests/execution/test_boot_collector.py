"""A worker boots with the cyclic collector held off, then collects once and freezes what the
boot made (``sglfix.execution.serve._collector_held_for_boot``). Probed in a fresh process: a
freeze in the test process would set apart every object pytest holds."""

from __future__ import annotations

from clihelp import run_probe

_PROBE = r"""
import gc, json, weakref
from sglfix.execution.serve import _collector_held_for_boot

class Node:
    pass

out = {}
before = gc.get_freeze_count()
with _collector_held_for_boot():
    out["inside"] = gc.isenabled()
    kept = [[i] for i in range(5000)]  # what a boot imports: it lives as long as the worker
    node = Node(); node.me = node      # garbage in a cycle, left by the boot
    gone = weakref.ref(node)
    del node
    out["cycle_kept_while_held"] = gone() is not None
out["after"] = gc.isenabled()
out["cycle_collected"] = gone() is None
out["boot_objects_frozen"] = gc.get_freeze_count() - before >= 5000

# A boot that fails: the collector is on again, nothing frozen.
before = gc.get_freeze_count()
try:
    with _collector_held_for_boot():
        raise SystemExit(2)
except SystemExit:
    pass
out["after_failed_boot"] = gc.isenabled()
out["nothing_frozen_on_failure"] = gc.get_freeze_count() == before

# A process that had turned the collector off keeps it off.
gc.disable()
with _collector_held_for_boot():
    pass
out["stays_off"] = not gc.isenabled()
print(json.dumps(out))
"""


def test_the_boot_runs_without_the_collector_then_collects_once_and_freezes():
    out = run_probe(_PROBE)
    assert out == {
        "inside": False,
        "cycle_kept_while_held": True,
        "after": True,
        "cycle_collected": True,
        "boot_objects_frozen": True,
        "after_failed_boot": True,
        "nothing_frozen_on_failure": True,
        "stays_off": True,
    }, out
