"""What a fatal GPU fault in one process does to the others sharing the GPU, with and without an
MPS daemon (run it with CUDA_MPS_PIPE_DIRECTORY pointing at a running daemon for the MPS case).

Three bystanders run small kernels, each followed by a read, for a few seconds; a fourth process
stores through a wild pointer from a Triton kernel (an illegal address: sticky, fatal to its
context). Each reports how far it got and what it met. A fresh process tries the GPU while the
bystanders still run, and another once every process has exited. Exit 0 always: the JSON is the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from relpaths import relativize

_BYSTANDER = r"""
import json, sys, time, torch
torch.cuda.init(); x = torch.ones(1024, device="cuda"); x.sum().item()
print("ready", flush=True)
t0 = time.time(); n = 0; err = None
while time.time() - t0 < float(sys.argv[1]):
    try:
        n += 1; v = (x * 2).sum().item()
    except Exception as e:
        err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"; break
print(json.dumps({"iterations": n, "error": err, "at_s": round(time.time() - t0, 2)}), flush=True)
"""

_FAULTER = r"""
import json, sys, time, torch, triton, triton.language as tl
@triton.jit
def wild(p, off):
    tl.store(p + off, 1.0)
x = torch.ones(4, device="cuda"); x.sum().item()
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
t0 = time.time(); err = None
try:
    wild[(1,)](x, 1 << 40); torch.cuda.synchronize()
except Exception as e:
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
print(json.dumps({"error": err, "at_s": round(time.time() - t0, 2)}), flush=True)
"""

_FRESH = r"""
import json, time, torch
t0 = time.time()
try:
    v = torch.ones(8, device="cuda").sum().item(); err = None
except Exception as e:
    v, err = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
print(json.dumps({"value": v, "error": err, "s": round(time.time() - t0, 2)}), flush=True)
"""


def _spawn(code: str, *args: str) -> subprocess.Popen:
    # From a file: Triton reads a kernel's source from the file it is defined in.
    fd, path = tempfile.mkstemp(suffix=".py", prefix="mps-probe-")
    with os.fdopen(fd, "w") as fh:
        fh.write(code)
    return subprocess.Popen([sys.executable, path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _last_json(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"timed_out": True, "rc": proc.returncode, "stderr": err[-300:]}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"stdout": out[-300:]}
    row.update(rc=proc.returncode, stderr_tail=err.strip().splitlines()[-1][:200] if err.strip() else "")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    t0 = time.time()
    bystanders = [_spawn(_BYSTANDER, str(args.seconds)) for _ in range(3)]
    faulter = _spawn(_FAULTER, "2")
    rows = {"faulter": _last_json(faulter, 120)}
    during = _spawn(_FRESH)  # a new process while the bystanders still run
    rows["bystanders"] = [_last_json(p, 120) for p in bystanders]
    rows["fresh_while_they_ran"] = _last_json(during, 60)
    rows["fresh_after_all_exited"] = _last_json(_spawn(_FRESH), 60)
    rows.update(mps=mps, wall_s=round(time.time() - t0, 1))
    with open(args.json, "w") as fh:
        json.dump(relativize(rows), fh, indent=1)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
