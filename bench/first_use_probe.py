"""What a fresh worker pays once, measured in fresh processes on the GPU: importing FlashInfer
(whose package import registers torch custom ops) before and after the process's CUDA context
exists, torch custom-op registration alone in both orders, Triton's ``triton_key`` (a hash of its
own files, computed once per process), and under a private MPS daemon the first client's CUDA
start (which starts the MPS server) against the next client's, with and without the server
started ahead (``start_server``).

    python3 bench/first_use_probe.py --json OUT.json [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from relpaths import relativize

_CHILD = r"""
import json, os, sys, time
order = sys.argv[1]
t0 = time.perf_counter()
import torch
out = {"import_torch_s": time.perf_counter() - t0}

def cuda():
    t = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out["cuda_init_s"] = time.perf_counter() - t

def custom_ops(tag):
    t = time.perf_counter()
    for i in range(5):
        @torch.library.custom_op(f"sglfixprobe{tag}::op{i}", mutates_args=("out",))
        def f(x: torch.Tensor, out: torch.Tensor) -> None:
            out.copy_(x)
        @torch.library.register_fake(f"sglfixprobe{tag}::op{i}")
        def g(x, out):
            return None
    out[f"custom_ops_5_{tag}_s"] = time.perf_counter() - t

def flashinfer(tag):
    t = time.perf_counter()
    import flashinfer  # noqa: F401
    out[f"import_flashinfer_{tag}_s"] = time.perf_counter() - t

if order == "ops":
    custom_ops("before")
    cuda()
    custom_ops("after")
elif order == "fi-before":
    flashinfer("before")
    cuda()
elif order == "fi-after":
    cuda()
    flashinfer("after")
elif order == "triton":
    from triton.runtime.cache import triton_key
    t = time.perf_counter()
    triton_key()
    out["triton_key_s"] = time.perf_counter() - t
elif order == "cuda":
    cuda()
print("RESULT " + json.dumps(out))
"""


def _child(order: str, env: dict | None = None) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, order], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        return {"error": (p.stderr or p.stdout)[-600:], "rc": p.returncode}
    return {k: round(v, 4) for k, v in json.loads(line[len("RESULT ") :]).items()}


def _mps(repeat: int) -> dict:
    """First client against the next, on a private daemon each time; then with the server started ahead."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return {"skipped": "no nvidia-cuda-mps-control"}
    rows = []
    for ahead in (False, True):
        for _ in range(repeat):
            pipe = tempfile.mkdtemp(prefix="mps-probe-")
            env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": pipe}
            daemon = subprocess.Popen([control, "-f"], env={**os.environ, **env}, stdout=subprocess.DEVNULL)
            time.sleep(0.5)
            row = {"server_started_ahead": ahead}
            if ahead:
                t = time.perf_counter()
                r = subprocess.run(
                    [control],
                    input=f"start_server -uid {os.getuid()}\n",
                    text=True,
                    capture_output=True,
                    env={**os.environ, **env},
                )
                row["start_server_s"] = round(time.perf_counter() - t, 3)
                row["start_server_reply"] = (r.stdout + r.stderr).strip()[-200:]
            row["first_client"] = _child("cuda", env)
            row["second_client"] = _child("cuda", env)
            subprocess.run([control], input="quit\n", text=True, capture_output=True, env={**os.environ, **env})
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
            shutil.rmtree(pipe, ignore_errors=True)
            rows.append(row)
    return {"rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    result: dict = {
        "bench": "first_use_probe",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "bench/first_use_probe.py", *sys.argv[1:]]),
        "runs": {},
    }
    for order in ("cuda", "ops", "fi-before", "fi-after", "triton"):
        rows = [_child(order) for _ in range(ns.repeat)]
        result["runs"][order] = rows
        keys = sorted({k for r in rows for k in r if k.endswith("_s")})
        print(order, {k: statistics.median(r[k] for r in rows if k in r) for k in keys}, flush=True)
    result["mps"] = _mps(ns.repeat)
    for r in result["mps"].get("rows", []):
        print(
            "mps",
            r.get("server_started_ahead"),
            r.get("start_server_s"),
            r.get("start_server_reply", ""),
            r["first_client"].get("cuda_init_s"),
            r["second_client"].get("cuda_init_s"),
            flush=True,
        )
    with open(ns.json, "w") as f:
        json.dump(relativize(result), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
