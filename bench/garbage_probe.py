"""What each cell leaves to the cyclic garbage collector: a worker's cells run in this process
(``serve._boot`` then ``Session.handle``, as ``bench/cell_profile.py`` runs them), and after each
one a collection with ``gc.DEBUG_SAVEALL`` keeps what it found unreachable: how many objects, of
which types, how much device memory their tensors held, and for the largest tensors the chain of
referrers inside that garbage that kept them (the cycle to break).

    python3 bench/garbage_probe.py --device cuda --cells 40 --json OUT.json
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import time

from relpaths import relativize


def _name(o) -> str:
    t = type(o)
    mod = t.__module__
    base = t.__qualname__ if mod in ("builtins",) else f"{mod}.{t.__qualname__}"
    if t.__name__ == "function":
        return f"function {getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', '?')}"
    if t.__name__ == "frame":
        return f"frame {o.f_code.co_filename}:{o.f_code.co_name}"
    if t.__name__ == "cell":
        return "cell"
    return base


def _chain(target, pool_ids: set[int], depth: int = 6) -> list[str]:
    """Referrers of ``target`` inside the garbage, one step at a time (each time preferring an
    object or its ``__dict__`` over a bare tuple or list), as type names."""
    out, seen, cur = [], {id(target)}, target
    for _ in range(depth):
        refs = [r for r in gc.get_referrers(cur) if id(r) in pool_ids and id(r) not in seen]
        if not refs:
            break
        # Prefer a container that names something (an object's dict, a function) over a bare tuple.
        refs.sort(key=lambda r: (isinstance(r, (tuple, list)), type(r).__name__))
        cur = refs[0]
        seen.add(id(cur))
        if isinstance(cur, dict):
            owners = [o for o in gc.get_referrers(cur) if id(o) in pool_ids and getattr(o, "__dict__", None) is cur]
            if owners:
                out.append(f"{_name(owners[0])}.__dict__")
                cur = owners[0]
                seen.add(id(cur))
                continue
            out.append(f"dict({', '.join(map(str, list(cur)[:6]))})")
            continue
        out.append(_name(cur))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cells", type=int, default=40)
    ap.add_argument("-s", "--scenario", action="append", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cell_profile
    import torch

    from sglfix.execution.serve import _boot
    from sglfix.execution.session import Session

    info = _boot(a.device)
    cells, _sets = cell_profile._plan(1, a.scenario)
    session = Session(device=info["device"], allowed_prefixes=None)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    rows = []
    for i, c in enumerate(cells[: a.cells]):
        session.handle({"id": i, "toggles": list(c.toggles), "scenario": c.scenario.to_json()})
        t = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - t
        garbage = list(gc.garbage)
        gc.garbage.clear()
        ids = {id(o) for o in garbage}
        types = collections.Counter(_name(o) for o in garbage)
        tensors = [o for o in garbage if isinstance(o, torch.Tensor)]
        dev = [o for o in tensors if o.device.type != "cpu"]
        storages = {}
        for o in dev:
            st = o.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        biggest = sorted(dev, key=lambda o: -o.untyped_storage().nbytes())[:2]
        row = {
            "scenario": c.scenario.name,
            "objects": len(garbage),
            "collect_ms": round(took * 1e3, 1),
            "device_tensor_mib": round(sum(storages.values()) / 2**20, 1),
            "types": types.most_common(25),
            "chains": [[f"{tuple(o.shape)} {o.dtype}", *_chain(o, ids)] for o in biggest],
        }
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("scenario", "objects", "collect_ms", "device_tensor_mib")}), flush=True)
        for ch in row["chains"]:
            print("   ", " <- ".join(ch), flush=True)
        # Free what was found: saved, it would be found (and counted) again by the next collection.
        del garbage, tensors, dev, biggest, ids
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                relativize({"bench": "garbage_probe", "device": info.get("device_name"), "rows": rows}), f, indent=1
            )


if __name__ == "__main__":
    main()
