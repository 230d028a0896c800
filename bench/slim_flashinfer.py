"""Repack the FlashInfer wheel without the kernel sources sglfix never compiles.

The device machine has no network and a checkout travels with at most 64 MiB, so the wheel is
carried in ``.cache/``; the full 0.7.2 wheel alone is 62 MB. sglfix JIT-compiles the paged
decode, prefill (FA2, and FA3 on Hopper) and MLA kernels (csrc/batch_*, include/, cutlass/include,
cutlass/tools/util, cccl);
sources of unrelated kernel families (MoE, sampling, linear attention, Blackwell-only kernels)
and bundled examples are dropped. Python modules are all kept, so ``import flashinfer`` is
unchanged. RECORD is rewritten for the files that remain.

Usage: python bench/slim_flashinfer.py IN.whl OUT_DIR
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

DROP_PREFIXES = tuple(
    f"flashinfer/data/{p}"
    for p in (
        "csrc/cake_",
        "csrc/kda",
        "csrc/gdn",
        "csrc/fused_moe",
        "csrc/blackwell_",
        "csrc/experimental",
        "csrc/alphamoe",
        "csrc/nv_internal",
        "csrc/cutlass_",
        "csrc/moe",
        "csrc/trtllm_",
        "csrc/xqa",
        "cutlass/examples",
        "cutlass/python",
        "cutlass/test",
        # cutlass/tools/util stays: FlashInfer's Hopper (FA3) prefill kernels include its headers.
        "cutlass/tools/library",
        "cutlass/tools/profiler",
        "cutlass/tools/copy_",
        "cutlass/media",
        "cccl/python",
        "cccl/docs",
        "cccl/test",
        "cccl/examples",
    )
)


def keep(name: str) -> bool:
    return not name.startswith(DROP_PREFIXES)


def main() -> int:
    src, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    records = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename == record_name or not keep(info.filename):
                continue
            data = zin.read(info.filename)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{info.filename},sha256={digest},{len(data)}")
        records.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(records) + "\n")
    print(f"{dst}: {dst.stat().st_size / 1e6:.1f} MB (from {src.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
