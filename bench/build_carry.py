"""Build ``.cache/``, what every mode of ``bench/gpu_run.sh`` reads on the GPU machine (which has
no network), from the package registries, in one command:

    python bench/build_carry.py            # every part; --parts pydeps fi sglang ray for some

Parts (each into ``.cache/``, replacing what was there):

* ``pydeps-whl/``: the wheels sglfix needs that the GPU image lacks (pydantic and its core,
  junitparser, unidiff, hypothesis), for CPython 3.12 on x86-64 Linux.
* ``fi-xz/fi-site.tar.xz``: FlashInfer 0.7.2.post1 slimmed (``bench/slim_flashinfer.py``) and
  apache-tvm-ffi, installed into one site folder and packed with xz (13 MB instead of 30).
* ``sglang-gpu/``: sglang 0.5.23's Python files (``sglang-py.tar.xz``: the wheel installed
  without its Rust extension modules, which nothing sglfix drives imports; never ``sgl_kernel``)
  and the wheels of the packages it imports that the image lacks (``wheels/``).
* ``ray-whl/``: Ray 2.52.1 slimmed to what local clusters and actors need (no Java, no dashboard
  web client, no RLlib/Tune/Serve/Data/Train/LLM libraries) as ``ray-slim.tar.xz``, and the
  wheels of jsonschema, which it imports and the image lacks.

The compile caches are no registry's: a GPU run hands them back (``triton-cache.tgz``,
``flashinfer-jit.tgz``, and ``sglang-cache.tar.xz``: sglang's own Triton kernels and JIT modules,
which it keeps under ``~/.cache/sglang``, and FlashInfer's JIT build of every real-sglang run, which
importing sglang redirects there); put them in ``.cache/`` as ``triton.tgz``,
``flashinfer-jit.tgz``, ``sglang-cache.tar.xz``. A run without them starts cold (a fresh machine's
first real-sglang matrix pays ~60 s more without sglang's).

Last, what each mode carries is added up against the 64 MiB a device call takes (the checkout's
tracked files plus the carried folders); exit 1 when one is over.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
LIMIT = 64 * 2**20
# The GPU machine's Python: every binary wheel is chosen for it, whatever Python builds the carry.
TARGET = [
    "--only-binary=:all:",
    "--python-version", "3.12",
    "--implementation", "cp",
    "--abi", "cp312",
    "--platform", "manylinux2014_x86_64",
    "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux_2_28_x86_64",
    "--platform", "manylinux_2_26_x86_64",
    "--platform", "manylinux_2_34_x86_64",
    "--platform", "manylinux1_x86_64",
    "--platform", "manylinux_2_5_x86_64",
]  # fmt: skip

PYDEPS = [
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "junitparser==5.0.3",
    "unidiff==1.0.1",
    # sglfix search draws its scenarios through hypothesis.
    "hypothesis==6.170.17",
    "sortedcontainers==2.4.0",
]
FLASHINFER = "flashinfer-python==0.7.2.post1"
TVM_FFI = "apache-tvm-ffi==0.1.15.post2"
SGLANG = "sglang==0.5.23"
# What sglang 0.5.23's modules import at module level that the GPU image does not have.
# pydeps-whl (installed first by every gpu_run.sh mode) already brings pydantic and its own
# dependencies: not twice in one carry, whose 64 MiB the sglang modes fill.
SGLANG_DEPS = [
    "compressed-tensors==0.20.0",
    "dill==0.4.1",
    "distro==1.9.0",
    "fastapi==0.165.0",
    "gguf==0.19.0",
    "ipython==9.18.1",
    "loguru==0.7.3",
    "msgspec==0.22.0",
    "openai==2.8.0",
    "opentelemetry-api==1.45.2",
    "orjson==3.13.0",
    "partial-json-parser==0.2.1.1.post7",
    "pybase64==1.5.1",
    "pyzmq==27.3.0",
    "setproctitle==1.3.8",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "traitlets==5.16.1",
    "uvicorn==0.54.0",
]
RAY = "ray==2.52.1"
RAY_DEPS = ["jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs"]
# Inside the ray package: what a local cluster of actors never loads.
RAY_DROPPED = (
    "jars",
    "dashboard/client",
    "rllib",
    "tune",
    "serve",
    "data",
    "train",
    "llm",
    "air/examples",
    "_private/runtime_env/agent/thirdparty_files",
)

# What each gpu_run.sh mode carries (besides the checkout's tracked files), as bench/README.md says.
MODES = {
    "default (matrices, probe)": ["fi-xz", "pydeps-whl", "flashinfer-jit.tgz", "triton.tgz"],
    "ONLY=sglang / fix / finding / speed / flashinfer / mutate": [
        "fi-xz",
        "pydeps-whl",
        "sglang-gpu",
        "flashinfer-jit.tgz",
        "triton.tgz",
        "sglang-cache.tar.xz",
    ],
    "ONLY=scale": ["fi-xz", "pydeps-whl", "ray-whl", "flashinfer-jit.tgz", "triton.tgz"],
}


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pip {' '.join(args)} failed:\n{r.stderr[-3000:]}")


def download(dest: Path, *reqs: str, deps: bool = False) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    pip("download", *TARGET, *([] if deps else ["--no-deps"]), "-d", str(dest), *reqs)
    return sorted(set(dest.iterdir()) - before) or sorted(dest.iterdir())


def install(wheels: list[Path], site: Path) -> None:
    """Install ``wheels`` (built for the GPU machine's Python) into the folder ``site``."""
    # No bytecode: it would double the size, and gpu_run.sh compiles on the machine.
    pip("install", *TARGET, "--no-deps", "--no-index", "--no-compile", "--target", str(site), *map(str, wheels))


def pack(folder: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:xz", preset=9) as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)


def fresh(path: Path) -> Path:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.mkdir(parents=True)
    return path


def build_pydeps(tmp: Path) -> None:
    out = fresh(CACHE / "pydeps-whl")
    download(out, *PYDEPS)


def build_fi(tmp: Path) -> None:
    got = download(tmp / "fi", FLASHINFER, TVM_FFI)
    fi = next(p for p in got if p.name.startswith("flashinfer_python"))
    slim = tmp / "fi-slim"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "slim_flashinfer.py"), str(fi), str(slim)])
    if r.returncode != 0:
        raise SystemExit("bench/slim_flashinfer.py failed")
    wheels = [*slim.glob("*.whl"), *(p for p in got if p.name.startswith("apache_tvm_ffi"))]
    site = fresh(tmp / "fi-site")
    install(wheels, site)
    pack(site, fresh(CACHE / "fi-xz") / "fi-site.tar.xz")


def build_sglang(tmp: Path) -> None:
    got = download(tmp / "sg", SGLANG)
    site = fresh(tmp / "sg-site")
    install(got, site)  # then without its Rust extension modules
    for so in site.glob("sglang/**/*.so"):
        so.unlink()
    # The diffusion engine (sglang.multimodal_gen: nothing of the LLM engine, its kit or its
    # kernels imports it) would push the sglang modes' carry over 64 MiB once the compile caches
    # ride along.
    for extra in ("bin", "sglang/multimodal_gen"):
        shutil.rmtree(site / extra, ignore_errors=True)
    out = fresh(CACHE / "sglang-gpu")
    pack(site, out / "sglang-py.tar.xz")
    download(out / "wheels", *SGLANG_DEPS)


def build_ray(tmp: Path) -> None:
    got = download(tmp / "ray", RAY)
    site = fresh(tmp / "ray-site")
    install(got, site)
    for rel in RAY_DROPPED:
        shutil.rmtree(site / "ray" / rel, ignore_errors=True)
    shutil.rmtree(site / "bin", ignore_errors=True)
    out = fresh(CACHE / "ray-whl")
    pack(site, out / "ray-slim.tar.xz")
    download(out, *RAY_DEPS, deps=False)


PARTS = {"pydeps": build_pydeps, "fi": build_fi, "sglang": build_sglang, "ray": build_ray}


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def checkout_size() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def main() -> None:
    global CACHE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    ap.add_argument("--out", default=str(CACHE), help="the folder to build (default: .cache of this checkout)")
    a = ap.parse_args()
    CACHE = Path(a.out).resolve()
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sglfix-carry-") as tmp:
        for name in a.parts:
            print(f"building {name} ...", flush=True)
            PARTS[name](Path(tmp))
    checkout = checkout_size()
    over = False
    print(f"checkout (tracked files): {checkout / 2**20:.1f} MiB")
    for mode, paths in MODES.items():
        parts = {p: size(CACHE / p) for p in paths}
        total = checkout + sum(parts.values())
        missing = [p for p in paths if not (CACHE / p).exists()]
        flag = "OVER" if total > LIMIT else "ok"
        over |= total > LIMIT
        shown = ", ".join(f"{p} {s / 2**20:.1f}" for p, s in parts.items())
        print(
            f"{flag:4} {mode}: {total / 2**20:.1f} MiB of 64 ({shown}){'; not built: ' + ', '.join(missing) if missing else ''}"
        )
    if over:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
