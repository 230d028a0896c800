"""The kit keeps sglang's runtime context as it found it.

The kit's fixtures publish server args, write flag leaves and set parallel overrides, and never
take them back; ``context_kept`` puts them back, by each slot of the context and the leaves of
what is written in place (0.5.16-0.5.18 have no ``snapshot_context``; from 0.5.19 it keeps the
parallel override table by reference). Run on the installed sglang in a fresh interpreter, with
sglang's snapshot hidden to show none is used: after the block, every slot, flag leaf and parallel
override is what it was, though the block left a publish and an override open and wrote a leaf.
"""

from __future__ import annotations

import json

from real_sglang import clean_env, require_sglang, run_python

CHECK = """
import json, sys
from sglfix import codebases
codebases.activate("sglang-0.5.23")
from sglang.srt import runtime_context as rc
from sglfix.harness.kits import kit
if hasattr(rc, "snapshot_context"):
    del rc.snapshot_context, rc.restore_context  # as 0.5.16-0.5.18 have it
ctx = rc.get_context()

def state():
    return {
        "server_args": id(ctx._server_args),
        "capture": rc.get_flags().capture.enable_torch_compile,
        "flags": id(ctx.flags),
        "parallel": repr(sorted(ctx.parallel._overrides.items())) if hasattr(ctx.parallel, "_overrides") else "",
    }

before = state()
with kit("probes").context_kept():
    ctx.override_server_args(page_size=16, speculative_algorithm="EAGLE").__enter__()  # never exited
    rc.get_flags().capture.enable_torch_compile = not before["capture"]
    ctx.parallel.override(moe_ep_size=1).__enter__()
    inside = state()
print(json.dumps({"before": before, "inside": inside, "after": state()}))
"""


def test_the_context_is_put_back():
    require_sglang()
    r = run_python(CHECK, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["inside"] != seen["before"], "the block changed nothing: the check cannot fail"
    assert seen["after"] == seen["before"], seen
