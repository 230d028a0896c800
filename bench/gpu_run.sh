#!/usr/bin/env bash
# One device call: install sglfix without network, run the GPU backend tests, doctor, the full
# matrix (every toggle and part) on CUDA, compare it cell by cell with the committed CPU matrix and
# with the CUDA matrix of the previous layout, and probe FAULT/TIMEOUT isolation on CUDA.
# Everything lands in $OUT; a short table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/sglfix-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $*"; }
log "device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
if [ -f .cache/triton.tgz ]; then mkdir -p ~/.triton && tar -xzf .cache/triton.tgz -C ~/.triton; fi
log "install"
# pydantic is not on the GPU machine and there is no network: wheels carried in .cache/pydeps-whl
if ls .cache/pydeps-whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-deps --no-index .cache/pydeps-whl/*.whl 2>&1 | tail -2; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -c "import sglfix.backends, sglfix; print('sglfix from', sglfix.__file__)"
log "backend tests on CUDA"
t0=$(date +%s.%N)
python3 -m pytest -q tests/backends -p no:cacheprovider 2>&1 | tail -4 | tee "$OUT/pytest-backends.txt"
log "doctor"
python3 -m sglfix doctor --json > "$OUT/doctor.json"; echo "doctor rc=$?"
log "matrix on CUDA"
COLUMNS=250 python3 -m sglfix matrix --parts --device cuda --json "$OUT/matrix-cuda.json" > "$OUT/matrix-cuda.txt" 2>&1
echo "matrix rc=$?"
grep -E "^(met|UNMET|unexpected|sglfix matrix)" "$OUT/matrix-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -30
grep -E "matrix on" "$OUT/matrix-cuda.txt"
log "parity with the CPU matrix"
python3 bench/parity.py bench/results/matrix-cpu.json "$OUT/matrix-cuda.json" --json "$OUT/parity.json"
echo "parity rc=$?"
log "parity with the CUDA matrix of the previous layout"
python3 bench/parity.py bench/results/matrix-cuda-3a461bc.json "$OUT/matrix-cuda.json" --json "$OUT/parity-prev.json"
echo "parity-prev rc=$?"
log "a cell whose code under test segfaults on CUDA: FAULT, the run completes, no worker left"
python3 bench/fault_probe.py --device cuda --json "$OUT/fault-cuda.json"; echo "fault rc=$?"
tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/matrix-cuda.json"))
p = json.load(open(f"{out}/parity.json"))
q = json.load(open(f"{out}/parity-prev.json"))
f = json.load(open(f"{out}/fault-cuda.json"))
print(f"{'cells':>8} {'wall_s':>8} {'agree':>6} {'differ':>6} {'prev-agree':>10} {'prev-differ':>11}  summary")
print(f"{len(m['cells']):>8} {m['wall_s']:>8} {p['agree']:>6} {len(p['differ']):>6} {q['agree']:>10} {len(q['differ']):>11}  {m['summary']}")
print("fault probe:", [(c['cell'], c['verdict'], c['seconds']) for c in f['cells']], "workers left", f['workers_left'])
PY
