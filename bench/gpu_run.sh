#!/usr/bin/env bash
# One device call: install sglfix and FlashInfer without network, check the FlashInfer calls the
# backends rely on (and warm its JIT cache), run the GPU backend tests, doctor, the full matrix
# (every toggle and part) on CUDA twice (every cell with the JIT caches as carried, then warm with
# reachability), compare it cell by cell with the committed CPU matrix, and probe FAULT/TIMEOUT
# isolation on CUDA.
# Carry .cache (pydantic and FlashInfer wheels, JIT caches). ONLY=probe stops after the matrices and the probe;
# ONLY=smoke runs a short GPU check of the FlashInfer-MLA draft and Triton draft-extend cells.
# ONLY=mps: the reproduction with default options (MPS) against --mps off, the MPS fault tests, a parent killed mid-run.
# ONLY=install stops once everything is installed (then source nothing: PYTHONPATH=/tmp/site).
# ONLY=firstuse: what a fresh worker pays once (bench/first_use_probe.py).
# ONLY=memory records each cell's device memory in one process (bench/cell_profile.py --memory).
# ONLY=scale runs only the scale-out benchmark (bench/scale_out.py; Ray from .cache/ray-whl).
# ONLY=profile times where a cell's time goes (bench/cell_profile.py, the parent under cProfile).
# ONLY=sglang runs the real-sglang matrix (--profile sglang-0.5.23; sglang from .cache/sglang-gpu);
# with SG_SCENARIOS (-s globs) only those scenarios, every part, in one matrix.
# ONLY=runner runs the matrix and bisect (--devices all, two shards) through the one runner.
# ONLY=fix checks the profile's candidate fixes on real sglang (bench/fix_check.py): the FlashInfer
# MLA one over the fimla scenarios, then over the whole matrix; the req_to_token one over the probes.
# ONLY=poison runs the reproduction matrix twice and real sglang's Triton draft-extend cells twice
# (nothing served): verdicts that do not depend on the allocator (sglfix.harness.poison).
# ONLY=mutate runs mutation campaigns over the FlashInfer families (real sglang REPEAT times, default
# once, then the reproduction): scores, survivors; a repeated campaign is served by the store.
# ONLY=flashinfer runs real sglang's FlashInferAttnBackend scenarios (every mode, the window ones, the
# GQA multi-step draft) with every part on CUDA (the CPU/GPU parity input), then a mutation campaign
# over them (MUTATE_ARGS for fewer cells per mutant or a --shard i/N; FI_LIMIT seconds at most;
# FI_MATRIX=0 skips the matrix, for a later shard's call; FI_MUTATE=0 the campaign; FI_FIX=1 checks the
# candidate window fix (fixes/flashinfer-swa-ragged-window.patch) over sglang-fi-*; FI_SCENARIOS replaces
# the matrix's -s selection, FI_MUTATE_SCENARIOS the campaign's (default -s sglang-fi-*; the FlashInfer-MLA
# family: -s sglang-fimla-* -s fimla-draft-*); FI_TIMEOUT the campaign's seconds per cell, for a machine
# whose FlashInfer JIT cache is cold).
# ONLY=again runs an earlier campaign's survivors again on real sglang with CUDA (sglfix mutate
#   --again $AGAIN $MUTATE_ARGS --survivors-every-cell), then the judges' engine breaks on CUDA
#   (tests/harness/test_sglang_judges.py's BREAKS through sglfix run --apply, $JUDGE_CELLS).
# ONLY=search runs sglfix search on real sglang with CUDA (the FlashInfer-MLA draft bug from the generic
# space, replayed with and without its candidate fix; a live-bug search per SEARCH_FAMILIES).
# ONLY=mutate-file runs the scenarios of MUT_FILE on real sglang with CUDA, then a mutation campaign
# over them (MUTATE_ARGS, atop the fixes MUT_APPLY): a judge only CUDA has (a sync-free path); with
# MUT_PATCHES (mutants as patches, sglfix mutate --show ID), each patch's cells atop the fixes instead.
# ONLY=scale with SCALE_CAMPAIGN: a mutation campaign over real sglang on 1 GPU, every GPU and Ray.
# ONLY=reverts searches every catalogue part shown alone (bench/search_bench.py --reverts --showable)
# in REV_SHARDS processes side by side (REV_PROFILES, REV_DEVICE, REV_EXAMPLES, REV_LIMIT).
# ONLY=survivors searches a mutation campaign's survivors (bench/search_bench.py --survivors) in
# SURV_SHARDS processes side by side (SURV_REPORT, SURV_DEVICE, SURV_ARGS, SURV_LIMIT; SURV_WARM: a
# scenario file run once first, so the kernels' JIT is built before the searches' clocks start).
# ONLY=finding writes the FlashInfer-MLA finding (report finding on the H100) and runs the Triton
# draft-extend scenarios with every part (PR 27545's expectations on CUDA).
# Everything lands in $OUT; a short table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/sglfix-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $*"; }
log "device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
if [ "${JIT:-}" != cold ] && [ -f .cache/triton.tgz ]; then mkdir -p ~/.triton && tar -xzf .cache/triton.tgz -C ~/.triton; fi
# torch.compile'd code of the engine (sglang) compiles through Inductor, whose cache lives in /tmp.
INDUCTOR=/tmp/torchinductor_$(whoami)
if [ "${JIT:-}" != cold ] && [ -f .cache/inductor.tgz ]; then mkdir -p "$INDUCTOR" && tar -xzf .cache/inductor.tgz -C "$INDUCTOR"; fi
# sglang's own caches (its Triton kernels under its own TRITON_CACHE_DIR, its JIT modules):
# without them every worker of a fresh machine compiles sglang's kernels again (bench/README.md).
if [ "${JIT:-}" != cold ] && [ -f .cache/sglang-cache.tar.xz ]; then mkdir -p ~/.cache/sglang && tar -xJf .cache/sglang-cache.tar.xz -C ~/.cache/sglang; fi
# The image sets PYTHONDONTWRITEBYTECODE=1 and ships torch without bytecode, so every process
# would compile torch's modules again on import (4.4 s against 2.3 s with bytecode, measured on
# the H100). A regular install has bytecode: a private cache stands in for it.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
log "install"
# pydantic is not on the GPU machine and there is no network: wheels carried in .cache/pydeps-whl
if ls .cache/pydeps-whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-deps --no-index .cache/pydeps-whl/*.whl 2>&1 | tail -2; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -c "import sglfix.backends, sglfix; print('sglfix from', sglfix.__file__)"
# FlashInfer: the slimmed wheel (bench/slim_flashinfer.py) and tvm-ffi, into a private site dir.
# Or the same two wheels unpacked as one xz tarball (.cache/fi-xz, less than half the size), for
# calls whose carry has no room for the wheels.
if [ -f .cache/fi-xz/fi-site.tar.xz ]; then
  mkdir -p /tmp/site && tar -xJf .cache/fi-xz/fi-site.tar.xz -C /tmp/site
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
elif ls .cache/fi-whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/fi-whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# JIT=cold starts from empty FlashInfer and Triton caches (the cold figure of the benchmark);
# otherwise the caches carried in .cache are restored.
if [ "${JIT:-}" = cold ]; then
  rm -rf ~/.cache/flashinfer ~/.triton
else
  JIT=cold
  if [ -f .cache/flashinfer-jit.tgz ]; then mkdir -p ~/.cache/flashinfer && tar -xzf .cache/flashinfer-jit.tgz -C ~/.cache/flashinfer && JIT=warm; fi
fi
echo "flashinfer JIT cache at start: $JIT" | tee "$OUT/jit-state.txt"
# A regular pip install leaves bytecode beside the sources; the unpacked tarballs do not, and
# without it every worker compiles the same modules again on first import.
[ -d /tmp/site ] && python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
python3 -m compileall -q -j 0 sglfix backends > /dev/null 2>&1
python3 -c "import torch, triton" 2>/dev/null  # torch's bytecode written once, before any timed run
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
# HOST=1 (any mode): first, how many CPUs the machine really gives (bench/host_cpus.py).
if [ "${HOST:-}" = 1 ]; then python3 bench/host_cpus.py --json "$OUT/host-cpus.json" | tail -1; fi
if [ "${ONLY:-}" = install ]; then exit 0; fi  # installed, caches restored: the caller's command goes on
if [ "${ONLY:-}" = firstuse ]; then
  # What a fresh worker pays once (bench/first_use_probe.py): FlashInfer's import before and
  # after the CUDA context, custom-op registration, Triton's key, an MPS client's start.
  python3 bench/first_use_probe.py --json "$OUT/first-use.json" --repeat ${REPEAT:-3} 2>&1 | tail -20; echo "first_use rc=${PIPESTATUS[0]}"
  exit 0
fi
if [ "${ONLY:-}" = smoke ]; then
  # A short check after a change to the worker's GPU path: the FlashInfer-MLA draft scenarios
  # (captures, and cells that crash inside their capture) and the Triton draft extend, every part.
  COLUMNS=200 timeout ${SMOKE_LIMIT:-150} python3 -m sglfix matrix --parts --no-reachability --device cuda --no-cache \
    -s 'fimla-*' -s 'triton-draft-extend-v2*' --json "$OUT/smoke.json" 2>&1 | tail -4; echo "smoke rc=${PIPESTATUS[0]}"
  exit 0
fi
if [ "${ONLY:-}" = memory ]; then
  # Each cell's device memory in one process (reserved after it, its peak, the driver's count),
  # over the plan's first SETS toggle sets: where a worker's memory grows.
  # MEMORY_GC=1: after each cell also a full collection and an emptied cache (what cycles held).
  python3 bench/cell_profile.py --device cuda --procs 1 --sets ${SETS:-6} --profile-sets 0 --memory ${MEMORY_GC:+--memory-gc} \
    --json "$OUT/memory${TAG:-}.json" 2>&1 | tail -3; echo "memory rc=${PIPESTATUS[0]}"
  exit 0
fi
install_ray() {
  # Ray: a slimmed wheel unpacked as an xz tarball plus jsonschema's wheels, in .cache/ray-whl;
  # skip_ray is --skip-ray where it does not import.
  skip_ray=""
  if [ -f .cache/ray-whl/ray-slim.tar.xz ]; then
    mkdir -p /tmp/site && tar -xJf .cache/ray-whl/ray-slim.tar.xz -C /tmp/site
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/ray-whl/*.whl 2>&1 | grep -v WARNING | tail -2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "import ray; print('ray', ray.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt" || true
  python3 -c "import ray" 2>/dev/null || skip_ray=--skip-ray
  python3 -c "import torch; print('GPUs', torch.cuda.device_count())" | tee -a "$OUT/gpu.txt"
}
if [ "${ONLY:-}" = scale ] && [ -z "${SCALE_CAMPAIGN:-}" ]; then
  # Scale-out: the full matrix on 1 GPU, on every GPU and through Ray (bench/scale_out.py).
  install_ray
  # PROFILES=1: the workers of every run under cProfile, merged per run into scale-logs/profiles/runN.txt.
  python3 bench/scale_out.py --json "$OUT/scale-out.json" --logs "$OUT/scale-logs" --budget-s ${SCALE_BUDGET:-470} --plan ${SCALE_PLAN:-scale} --timelines "$OUT/scale-logs/timelines" ${PROFILES:+--profiles "$OUT/scale-logs/profiles"} $skip_ray ${SCALE_ARGS:-}; echo "scale rc=$?"
  for d in "$OUT"/scale-logs/timelines/run*; do [ -d "$d" ] && echo "$d" && python3 bench/worker_timeline.py "$d" | tail -2; done
  for d in "$OUT"/scale-logs/profiles/run*; do [ -d "$d" ] && python3 bench/worker_profile.py "$d" --top 45 > "$d.txt" 2>&1; rm -rf "$d"; done
  (cd "$OUT" && tar -czf scale-logs.tgz scale-logs gpu.txt jit-state.txt && rm -rf scale-logs)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  exit 0
fi
if [ "${ONLY:-}" = profile ]; then
  # Where the time goes (bench/cell_profile.py): the default matrix once to warm the kernel caches,
  # again under cProfile (the parent's share: boot wait, dispatch, report, close), then the cells
  # in-process by 1 and by several processes at once, GPU utilisation sampled meanwhile.
  log "warm-up: default matrix with reachability"
  t0=$(date +%s.%N)
  COLUMNS=250 python3 -m sglfix matrix --parts --device cuda --json "$OUT/warm.json" > "$OUT/warm.txt" 2>&1
  echo "warm-up rc=$? $(python3 -c "import time;print(round(time.time()-$t0,1))") s"; tail -1 "$OUT/warm.txt"
  for mode in ${PARENT_MODES-reach every}; do
    flag=""; [ $mode = every ] && flag=--no-reachability
    t0=$(date +%s.%N)
    COLUMNS=250 python3 -m cProfile -o "$OUT/parent-$mode.prof" -m sglfix matrix --parts $flag --device cuda \
      --json "$OUT/parent-$mode.json" > "$OUT/parent-$mode.txt" 2>&1
    echo "parent $mode rc=$? $(python3 -c "import time;print(round(time.time()-$t0,1))") s"; tail -1 "$OUT/parent-$mode.txt"
    python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(30)" "$OUT/parent-$mode.prof" \
      > "$OUT/parent-$mode-prof.txt" 2>&1; grep -E "run_plan|execute|\(info\)|close|write_report|run_reaching|_wait|poll|json" "$OUT/parent-$mode-prof.txt" | head -14
  done
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 250 > "$OUT/gpu-util.csv" 2>&1 &
  smi=$!
  python3 bench/cell_profile.py --device cuda --procs ${PROCS:-1 4 6} --sets ${SETS:-12} --profile-sets ${PROFILE_SETS:-3} ${CELL_ARGS:-} \
    --prof-out "$OUT/cells.prof" --json "$OUT/cell-profile.json" > "$OUT/cell-profile.txt" 2>&1; echo "cell_profile rc=$?"
  head -6 "$OUT/cell-profile.txt"
  if [ -n "${KEEP:-}" ]; then
    python3 bench/cell_profile.py --device cuda --procs ${PROCS:-1 4 6} --sets ${SETS:-12} --profile-sets 0 --keep-cache \
      --json "$OUT/cell-profile-keep.json" > "$OUT/cell-profile-keep.txt" 2>&1; echo "cell_profile --keep-cache rc=$?"
    head -6 "$OUT/cell-profile-keep.txt"
  fi
  kill $smi 2>/dev/null
  if [ -n "${MPS:-}" ] && command -v nvidia-cuda-mps-control >/dev/null; then
    # The same cells with the processes sharing one GPU context through a private MPS daemon
    # (stopped again below): tells GPU time-slicing between contexts from host-side contention.
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && echo "MPS daemon started"
    python3 bench/cell_profile.py --device cuda --procs ${PROCS:-1 4 6} --sets ${SETS:-12} --profile-sets 0 \
      --json "$OUT/cell-profile-mps.json" > "$OUT/cell-profile-mps.txt" 2>&1; echo "cell_profile under MPS rc=$?"
    head -6 "$OUT/cell-profile-mps.txt"
    t0=$(date +%s.%N)
    COLUMNS=250 python3 -m sglfix matrix --parts --no-reachability --device cuda --json "$OUT/mps-every.json" > "$OUT/mps-every.txt" 2>&1
    echo "matrix every cell under MPS rc=$? $(python3 -c "import time;print(round(time.time()-$t0,1))") s"; tail -1 "$OUT/mps-every.txt"
    echo quit | nvidia-cuda-mps-control; sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
  (cd "$OUT" && tar -czf profile-logs.tgz --remove-files warm.* parent-* mps-* gpu-util.csv cell-profile*.txt cells.prof 2>/dev/null)
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  exit 0
fi
timed() {
  # timed NAME CMD...: run it, its output in $OUT/NAME.txt, the process's wall in $OUT/NAME.s
  local name=$1; shift
  local t0=$(date +%s%N)
  COLUMNS=250 "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$ms" > "$OUT/$name.s"
  echo "$name rc=$rc in $ms ms"; tail -1 "$OUT/$name.txt" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300
}
install_sglang() {
  # Real sglang 0.5.23 as the code under test: its Python files as an xz tarball and the
  # packages this image lacks as wheels (.cache/sglang-gpu), into a private site dir; never the
  # CUDA sgl_kernel wheel (a worker stands in for it: every function raises when called).
  log "real sglang"
  mkdir -p /tmp/sgsite && tar -xJf .cache/sglang-gpu/sglang-py.tar.xz -C /tmp/sgsite
  # Bytecode, as a regular install has (else every worker compiles the modules it imports lazily).
  python3 -m compileall -q -j 0 /tmp/sgsite/sglang > /dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --target /tmp/sgsite .cache/sglang-gpu/wheels/*.whl 2>&1 | grep -v WARNING | tail -2
  export PYTHONPATH=/tmp/sgsite${PYTHONPATH:+:$PYTHONPATH}
  python3 -m sglfix.execution.serve --check --device cuda --codebase sglang-0.5.23 > "$OUT/sglang-check.json" 2> "$OUT/sglang-check.err"
  echo "worker check rc=$?"; tail -3 "$OUT/sglang-check.err"; head -c 600 "$OUT/sglang-check.json"; echo
  local fi_ops=(~/.cache/sglang/.cache/flashinfer/*/*/cached_ops/*/*.so)
  echo "sglang's FlashInfer JIT cache at start: $([ -e "${fi_ops[0]}" ] && echo "${#fi_ops[@]} modules" || echo cold)" | tee -a "$OUT/jit-state.txt"
}
# Importing sglang points FlashInfer's JIT workspace, Triton and Inductor at its own cache folder
# (sglang.srt.environ.redirect_third_party_caches: FLASHINFER_WORKSPACE_BASE=~/.cache/sglang), so
# a real-sglang run compiles there and not under ~/.cache/flashinfer. The whole build folder goes
# back (objects and ninja logs too: FlashInfer always runs ninja, which rebuilds what is missing);
# carry it as .cache/sglang-cache.tar.xz and the next call starts warm.
save_sglang_caches() {
  du -sh ~/.cache/sglang ~/.cache/sglang/.cache/flashinfer 2>/dev/null
  tar -cf - -C ~/.cache/sglang --exclude='*.lock' . 2>/dev/null | xz -T0 -6 > "$OUT/sglang-cache.tar.xz" || true
  ls -la "$OUT/sglang-cache.tar.xz"
}
if [ "${ONLY:-}" = mps ]; then
  # The reproduction matrix (every cell, --no-cache) with default options (workers sharing the
  # GPU through sglfix's own MPS daemon) against --mps off, alternated, the GPU's peak memory
  # sampled and every run's verdicts compared with the committed CUDA matrix; the fault tests
  # under MPS (tests/execution/test_mps.py); a parent killed mid-run (SIGKILL, SIGTERM) must leave no worker
  # and no daemon; bench/mps_probe.py says what a fatal fault in one process does to the others.
  # MPS_JOBS="9 12" adds runs with --jobs N to each of MPS_ROUNDS (2) rounds, OFF_JOBS="6 8" runs
  # with --mps off --jobs N; MPS_OFF=0 leaves out the --mps off runs, MPS_PROBES=0 the kills and the
  # fault probes, MPS_TESTS=0 tests/execution/test_mps.py.
  peakrun() {  # name, then the command: timed, with the GPU's peak memory
    local name=$1; shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 300 > "$OUT/$name.mem" 2>/dev/null &
    local smi=$!
    timed "$name" "$@"; kill $smi 2>/dev/null; wait $smi 2>/dev/null
    echo "$name peak $(sort -n "$OUT/$name.mem" | tail -1) MiB"
    python3 bench/speed_summary.py "$OUT/$name.json" --process-s $(python3 -c "print(int(open('$OUT/$name.s').read())/1000)") \
      --label "$name" --json "$OUT/speed-$name.json" | head -1 | cut -c1-300
    python3 -m sglfix report compare bench/results/matrix-cuda.json "$OUT/$name.json" | tail -1
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('executor', r['executor'], 'reran alone', len(r.get('reran_alone') or []))" "$OUT/$name.json"
  }
  if [ "${MPS_TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/execution/test_mps.py > "$OUT/pytest-mps.txt" 2>&1; echo "pytest tests/execution/test_mps.py rc=$?"; tail -3 "$OUT/pytest-mps.txt"
  fi
  REPRO="python3 -m sglfix matrix --parts --no-reachability --device cuda --no-cache"
  for i in $(seq 1 ${MPS_ROUNDS:-2}); do
    peakrun repro-$i $REPRO --json "$OUT/repro-$i.json"
    [ "${MPS_OFF:-1}" = 1 ] && peakrun repro-off-$i $REPRO --mps off --json "$OUT/repro-off-$i.json"
    for j in ${MPS_JOBS:-}; do peakrun repro-jobs-$j-$i $REPRO --jobs $j --json "$OUT/repro-jobs-$j-$i.json"; done
    for j in ${OFF_JOBS:-}; do peakrun repro-off-jobs-$j-$i $REPRO --mps off --jobs $j --json "$OUT/repro-off-jobs-$j-$i.json"; done
  done
  if [ "${MPS_PROBES:-1}" = 1 ]; then
  for sig in KILL TERM; do  # (a background job of a script ignores SIGINT)
    $REPRO --json /tmp/killed.json > /tmp/killed.txt 2>&1 & parent=$!
    sleep 7; kill -$sig $parent; wait $parent; rc=$?; sleep 3
    echo "SIG$sig mid-run: rc=$rc, workers left: $(pgrep -f sglfix.execution.serve | wc -l), MPS processes left: $(pgrep -f nvidia-cuda-mps | wc -l)"
    pkill -9 -f sglfix.execution.serve; pkill -9 -f nvidia-cuda-mps; sleep 1
  done
  python3 bench/mps_probe.py --json "$OUT/fault-no-mps.json" > /dev/null 2>&1; echo "fault probe without MPS rc=$?"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    python3 bench/mps_probe.py --json "$OUT/fault-mps.json" > /dev/null 2>&1; echo "fault probe under MPS rc=$?"
    echo quit | nvidia-cuda-mps-control; sleep 1
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
  python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/speed-*.json"))]
for r in runs:
    r["gpu_memory_peak_mib"] = max((int(x) for x in open(f"{out}/{r['label']}.mem").read().split() if x.isdigit()), default=None)
    rep = json.load(open(f"{out}/{r['label']}.json"))
    r["mps"] = bool(rep["executor"].get("mps")); r["reran_alone"] = rep.get("reran_alone") or []
faults = {k: json.load(open(f"{out}/fault-{k}.json")) for k in ("no-mps", "mps") if glob.glob(f"{out}/fault-{k}.json")}
json.dump({"runs": runs, "faults": faults}, open(f"{out}/mps.json", "w"), indent=2)
for r in runs:
    print(f"{r['label']}: {r['cells_s']} s cells, {r['process_s']} s process, {r['workers']} workers, mps {r['mps']}, "
          f"peak {r['gpu_memory_peak_mib']} MiB, reran alone {len(r['reran_alone'])}, {r['outcome']}")
PY
  (cd "$OUT" && tar -czf mps-logs.tgz --remove-files repro-*.txt *.s *.mem speed-*.json fault-*.json repro-off-*.json repro-1.json \
    repro-jobs-*.json pytest-mps.txt gpu.txt jit-state.txt 2>/dev/null)
  exit 0
fi
if [ "${ONLY:-}" = speed ]; then
  # Speed (bench/README.md): the reproduction matrix, every cell, twice; the real-sglang matrix
  # (every reached cell, one process, default options, no shards) twice; then once more with each
  # worker under cProfile (SGLFIX_WORKER_PROFILE) to say where a worker's time goes. Never the
  # result store (--no-cache): these time the cells themselves.
  # MPS_OFF=1: one more run of each matrix with --mps off (the workers taking turns on the GPU).
  # REPRO_RUNS="1 2 3": how many reproduction runs (two by default).
  for i in ${REPRO_RUNS:-1 2} ${MPS_OFF:+off}; do
    extra=""; [ "$i" = off ] && extra="--mps off"
    SGLFIX_WORKER_TIMELINE=/tmp/tl-repro-$i timed repro-$i python3 -m sglfix matrix --parts --no-reachability --device cuda \
      --no-cache $extra --json "$OUT/repro-$i.json"
    python3 bench/worker_timeline.py /tmp/tl-repro-$i --json "$OUT/timeline-repro-$i.json" | tail -9 | cut -c1-400
    python3 bench/speed_summary.py "$OUT/repro-$i.json" --process-s $(python3 -c "print(int(open('$OUT/repro-$i.s').read())/1000)") \
      --label "reproduction, every cell, run $i" --json "$OUT/speed-repro-$i.json"
    # A faster run must give the same answers: every cell against the committed CUDA matrix.
    python3 -m sglfix report compare bench/results/matrix-cuda.json "$OUT/repro-$i.json" | tail -1
  done
  if [ "${PROFILE:-1}" = 1 ]; then
    SGLFIX_WORKER_PROFILE=/tmp/wprof-repro timed repro-prof python3 -m sglfix matrix --parts --no-reachability --device cuda \
      --no-cache --json "$OUT/repro-prof.json"
    python3 bench/worker_profile.py /tmp/wprof-repro --top 45 > "$OUT/worker-profile-repro.txt" 2>&1
    head -70 "$OUT/worker-profile-repro.txt" | cut -c1-220
  fi
  if [ -n "${SYNCS:-}" ]; then
    # SYNCS=1: the synchronising calls per cell by caller, one process, three toggle sets.
    python3 bench/cell_profile.py --device cuda --procs 1 --sets 3 --profile-sets 0 --count-syncs \
      --json "$OUT/syncs.json" > "$OUT/syncs.txt" 2>&1; echo "count-syncs rc=$?"; head -30 "$OUT/syncs.txt" | cut -c1-200
  fi
  # SGLANG=0: the reproduction only.
  [ "${SGLANG:-1}" = 0 ] && SPEED_RUNS= || SPEED_RUNS="1 2"
  [ -n "$SPEED_RUNS" ] && install_sglang
  touch /tmp/before-sglang-1
  for i in $SPEED_RUNS ${SPEED_RUNS:+${MPS_OFF:+off}}; do
    extra=""; [ "$i" = off ] && extra="--mps off"
    SGLFIX_WORKER_TIMELINE=/tmp/tl-sglang-$i timed sglang-$i python3 -m sglfix matrix --profile sglang-0.5.23 --parts --device cuda \
      --no-cache $extra --json "$OUT/sglang-$i.json"
    python3 bench/worker_timeline.py /tmp/tl-sglang-$i --json "$OUT/timeline-sglang-$i.json" | tail -9 | cut -c1-400
    python3 bench/speed_summary.py "$OUT/sglang-$i.json" --process-s $(python3 -c "print(int(open('$OUT/sglang-$i.s').read())/1000)") \
      --label "real sglang, run $i" --json "$OUT/speed-sglang-$i.json"
    python3 -m sglfix report compare bench/results/matrix-sglang-cuda.json "$OUT/sglang-$i.json" | tail -1
    if [ "$i" = 1 ]; then
      # What the first run left on disk that the second may read (a cache the carry lacks).
      echo "written by run 1, by folder:"
      find / -xdev -newer /tmp/before-sglang-1 -type f 2>/dev/null | grep -v -E "^/(proc|sys|dev|run)/|^$OUT|^/tmp/tl-" \
        | awk -F/ '{print "/"$2"/"$3"/"$4"/"$5}' | sort | uniq -c | sort -rn | head -25
    fi
  done
  if [ "${PROFILE:-1}" = 1 ] && [ -n "$SPEED_RUNS" ]; then
    SGLFIX_WORKER_PROFILE=/tmp/wprof timed sglang-prof python3 -m sglfix matrix --profile sglang-0.5.23 --parts --device cuda \
      --no-cache --json "$OUT/sglang-prof.json"
    python3 bench/worker_profile.py /tmp/wprof --top 45 > "$OUT/worker-profile.txt" 2>&1; head -70 "$OUT/worker-profile.txt" | cut -c1-220
  fi
  python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/speed-*.json"))]
json.dump(runs, open(f"{out}/speed.json", "w"), indent=2)
for r in runs:
    print(f"{r['label']}: {r['cells_s']} s cells, {r['process_s']} s process, {r['ran']} of {r['cells']} run, {r['outcome']}")
PY
  (cd "$OUT" && tar -czf speed-logs.tgz --remove-files repro-*.txt sglang-*.txt *.s speed-*.json repro-1.json repro-3.json sglang-1.json repro-off.json sglang-off.json gpu.txt jit-state.txt \
    repro-prof.json worker-profile*.txt repro-mps.json sglang-mps.json timeline-*.json \
    sglang-prof.json sglang-check.* syncs.txt 2>/dev/null)
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  tar -czf "$OUT/inductor-cache.tgz" -C "$INDUCTOR" . 2>/dev/null || true
  # sglang keeps caches of its own (its Triton kernels, its JIT modules, Inductor): ~/.cache/sglang.
  du -sh ~/.cache/sglang 2>/dev/null; tar -cJf "$OUT/sglang-cache.tar.xz" -C ~/.cache/sglang . 2>/dev/null || true
  exit 0
fi
if [ "${ONLY:-}" = fix ]; then
  install_sglang
  FIXES=profiles/sglang-0.5.23/fixes
  log "fimla fix over the fimla scenarios, every part, with and without it"
  COLUMNS=250 timeout ${FIX_LIMIT:-240} python3 bench/fix_check.py --profile sglang-0.5.23 --fix $FIXES/fimla-draft-plan.patch \
    --expect 'fimla-draft-topk1@*' --parts -s 'fimla-*' --device cuda --json "$OUT/fix-fimla-cuda-scenarios.json"; echo "rc=$?"
  log "req_to_token fix over the probes on CUDA"
  COLUMNS=250 timeout 120 python3 bench/fix_check.py --profile sglang-0.5.23 --fix $FIXES/req-to-token-headroom-ps1.patch \
    --expect probe-req-to-token-tree-ps1 --parts -s 'probe-*' --device cuda --json "$OUT/fix-req-to-token-cuda-probes.json"; echo "rc=$?"
  log "fimla fix over the whole matrix, every part"
  COLUMNS=250 timeout ${MATRIX_LIMIT:-420} python3 bench/fix_check.py --profile sglang-0.5.23 --fix $FIXES/fimla-draft-plan.patch \
    --expect 'fimla-draft-topk1@*' --parts --device cuda --json "$OUT/fix-fimla-cuda.json"; echo "rc=$?"
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  exit 0
fi
if [ "${ONLY:-}" = poison ]; then
  # Verdicts that do not depend on the allocator (sglfix.harness.poison): the reproduction's full
  # matrix twice (every cell, nothing served), each compared with the committed CUDA matrix and
  # with the other; then real sglang's Triton draft-extend cells (PR 27545 reads rows nothing
  # wrote) twice, compared with each other and with the committed real-sglang CUDA matrix.
  for i in 1 2; do
    log "poison: reproduction matrix on CUDA, run $i"
    COLUMNS=250 timeout ${REPRO_LIMIT:-240} python3 -m sglfix matrix --parts --no-reachability --no-cache --device cuda \
      --json "$OUT/poison-repro-$i.json" > "$OUT/poison-repro-$i.txt" 2>&1; echo "matrix rc=$?"
    tail -1 "$OUT/poison-repro-$i.txt" | sed 's/\x1b\[[0-9;]*m//g'
    python3 -m sglfix report compare bench/results/matrix-cuda.json "$OUT/poison-repro-$i.json" 2>&1 | tail -${TAIL:-12}
  done
  python3 -m sglfix report compare "$OUT/poison-repro-1.json" "$OUT/poison-repro-2.json" 2>&1 | tail -3
  install_sglang
  for i in 1 2; do
    log "poison: real-sglang Triton draft extend on CUDA, every part, run $i"
    COLUMNS=250 timeout ${SGLANG_LIMIT:-200} python3 -m sglfix matrix --profile sglang-0.5.23 --parts --no-cache \
      -s 'sglang-triton-draft-extend-v2*' --device cuda --json "$OUT/poison-sglang-$i.json" > "$OUT/poison-sglang-$i.txt" 2>&1
    echo "matrix rc=$?"; tail -1 "$OUT/poison-sglang-$i.txt" | sed 's/\x1b\[[0-9;]*m//g'
  done
  python3 -m sglfix report compare "$OUT/poison-sglang-1.json" "$OUT/poison-sglang-2.json" 2>&1 | tail -3
  python3 -m sglfix report compare bench/results/matrix-sglang-cuda.json "$OUT/poison-sglang-1.json" 2>&1 | tail -${TAIL:-12}
  (cd "$OUT" && tar -czf poison-logs.tgz --remove-files poison-*.txt sglang-check.* 2>/dev/null)
  exit 0
fi
if [ "${ONLY:-}" = mutate ]; then
  # Mutation campaigns on the GPU: real sglang's FlashInfer and FlashInfer-MLA metadata (its
  # FlashInfer backends build only on CUDA), then the reproduction's FlashInfer families, each
  # with the result store in $OUT (a second campaign is served); JSON and Markdown per campaign.
  install_sglang
  for i in $(seq 1 "${REPEAT:-1}"); do
    log "mutate: real sglang FlashInfer families on CUDA, campaign $i"
    COLUMNS=250 timeout ${SGLANG_LIMIT:-420} python3 -m sglfix --profile sglang-0.5.23 mutate --device cuda \
      -s 'fi-*' -s 'fimla-*' ${MUTATE_ARGS:-} --timeout 60 --cache "$OUT/store-sglang" --json "$OUT/mutate-sglang-cuda-$i.json" \
      --markdown "$OUT/mutate-sglang-cuda-$i.md" > "$OUT/mutate-sglang-$i.txt" 2>&1; echo "mutate rc=$?"
    tail -2 "$OUT/mutate-sglang-$i.txt" | sed 's/\x1b\[[0-9;]*m//g'
  done
  log "mutate: the reproduction's FlashInfer families on CUDA"
  COLUMNS=250 timeout ${REPRO_LIMIT:-240} python3 -m sglfix mutate --device cuda -s 'fi-*' -s 'fimla-*' ${MUTATE_ARGS:-} --timeout 60 \
    --cache "$OUT/store-repro" --json "$OUT/mutate-repro-cuda.json" --markdown "$OUT/mutate-repro-cuda.md" \
    > "$OUT/mutate-repro.txt" 2>&1; echo "mutate rc=$?"
  tail -2 "$OUT/mutate-repro.txt" | sed 's/\x1b\[[0-9;]*m//g'
  rm -rf "$OUT/store-sglang" "$OUT/store-repro"
  exit 0
fi
if [ "${ONLY:-}" = again ]; then
  install_sglang
  log "mutate --again $AGAIN on CUDA"
  set -f
  COLUMNS=250 timeout ${SGLANG_LIMIT:-420} python3 -m sglfix --profile sglang-0.5.23 mutate --device cuda --again "$AGAIN" \
    ${MUTATE_ARGS:-} --survivors-every-cell --timeout 120 --no-cache --json "$OUT/again-cuda.json" > "$OUT/again-cuda.txt" 2>&1
  echo "mutate rc=$?"
  set +f
  tail -2 "$OUT/again-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g'
  for patch in ${JUDGE_PATCHES:-}; do
    log "judge break $patch on CUDA: $JUDGE_CELLS"
    set -f
    COLUMNS=250 timeout 120 python3 -m sglfix --profile sglang-0.5.23 run --device cuda --no-cache $JUDGE_CELLS \
      --apply "$patch" --all --json "$OUT/judge-$(basename "$patch" .patch).json" > "$OUT/judge-$(basename "$patch" .patch).txt" 2>&1
    echo "run rc=$?"
    set +f
    tail -3 "$OUT/judge-$(basename "$patch" .patch).txt" | sed 's/\x1b\[[0-9;]*m//g'
  done
  exit 0
fi
if [ "${ONLY:-}" = mutate-file ]; then
  # A CUDA-only judge over real sglang (a sync-free path): the scenarios of $MUT_FILE at baseline,
  # then a mutation campaign over them ($MUTATE_ARGS: --function, --operators), every cell atop the
  # candidate fixes $MUT_APPLY (space-separated patch paths).
  install_sglang
  set -f
  apply=""; for p in ${MUT_APPLY:-}; do apply="$apply --apply $p"; done
  log "run --scenario-file $MUT_FILE on CUDA"
  COLUMNS=250 timeout 240 python3 -m sglfix --profile sglang-0.5.23 run --device cuda --scenario-file "$MUT_FILE" $apply \
    --all --no-cache --json "$OUT/file-run-cuda.json" > "$OUT/file-run-cuda.txt" 2>&1; echo "run rc=$?"
  tail -12 "$OUT/file-run-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300
  for patch in ${MUT_PATCHES:-}; do
    # One mutant as a patch atop the fixes (sglfix mutate --show ID's diff): its cells beside the base's.
    name=$(basename "$patch" .patch)
    COLUMNS=250 timeout 120 python3 -m sglfix --profile sglang-0.5.23 run --device cuda --scenario-file "$MUT_FILE" $apply \
      --apply "$patch" --all --no-cache --json "$OUT/patch-$name.json" > "$OUT/patch-$name.txt" 2>&1; echo "$name rc=$?"
    tail -1 "$OUT/patch-$name.txt" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200
  done
  if [ -n "${MUT_PATCHES:-}" ]; then set +f; exit 0; fi
  log "mutate --scenario-file $MUT_FILE on CUDA"
  COLUMNS=250 timeout ${SGLANG_LIMIT:-420} python3 -m sglfix --profile sglang-0.5.23 mutate --device cuda --scenario-file "$MUT_FILE" \
    $apply ${MUTATE_ARGS:-} --timeout 120 --no-cache --json "$OUT/mutate-file-cuda.json" > "$OUT/mutate-file-cuda.txt" 2>&1
  echo "mutate rc=$?"
  set +f
  tail -3 "$OUT/mutate-file-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g'
  exit 0
fi
if [ "${ONLY:-}" = flashinfer ]; then
  install_sglang
  if [ "${FI_MATRIX:-1}" != 0 ]; then
    log "real sglang FlashInfer scenarios on CUDA, every part"
    set -f  # the selection's globs are sglfix's, never the shell's
    COLUMNS=250 timeout ${MATRIX_LIMIT:-240} python3 -m sglfix --profile sglang-0.5.23 matrix --parts --device cuda \
      ${FI_SCENARIOS:--s sglang-fi-* -s fi-draft-*} --json "$OUT/matrix-fi-cuda.json" > "$OUT/matrix-fi-cuda.txt" 2>&1
    echo "matrix rc=$?"
    set +f
    grep -E "^(UNMET|unexpected|sglfix matrix)" "$OUT/matrix-fi-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -15
  fi
  if [ "${FI_FIX:-0}" = 1 ]; then
    log "the candidate window fix over the FlashInfer scenarios on CUDA, every part, with and without it"
    COLUMNS=250 timeout ${FIX_LIMIT:-240} python3 bench/fix_check.py --profile sglang-0.5.23 \
      --fix profiles/sglang-0.5.23/fixes/flashinfer-swa-ragged-window.patch --expect 'sglang-fi-extend-swa-long*' \
      --parts -s 'sglang-fi-*' --device cuda --json "$OUT/fix-fi-window-cuda.json"; echo "fix rc=$?"
  fi
  if [ "${FI_MUTATE:-1}" = 0 ]; then exit 0; fi
  log "mutate: real sglang FlashInferAttnBackend on CUDA"
  set -f
  COLUMNS=250 timeout ${FI_LIMIT:-300} python3 -m sglfix --profile sglang-0.5.23 mutate --device cuda ${FI_MUTATE_SCENARIOS:--s sglang-fi-*} \
    ${MUTATE_ARGS:-} --timeout ${FI_TIMEOUT:-60} --json "$OUT/mutate-fi-cuda.json" --markdown "$OUT/mutate-fi-cuda.md" \
    > "$OUT/mutate-fi-cuda.txt" 2>&1; echo "mutate rc=$?"
  set +f
  tail -2 "$OUT/mutate-fi-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g'
  [ -f "$OUT/mutate-fi-cuda.json" ] && gzip -f "$OUT/mutate-fi-cuda.json"
  save_sglang_caches
  exit 0
fi
if [ "${ONLY:-}" = finding ]; then
  install_sglang
  log "the FlashInfer-MLA finding"
  COLUMNS=250 python3 -m sglfix --profile sglang-0.5.23 run -s 'fimla-draft-topk1@*' --device cuda \
    --json "$OUT/fimla-draft-topk1.report.json" > "$OUT/fimla-run.txt" 2>&1; echo "run rc=$? (1: the known divergence shows)"
  tail -3 "$OUT/fimla-run.txt"
  python3 -m sglfix report finding "$OUT/fimla-draft-topk1.report.json" 'baseline::fimla-draft-topk1@cg=graph-padded' \
    -o "$OUT/fimla-draft-topk1.md"; echo "finding rc=$?"
  log "Triton draft extend on CUDA, every part (PR 27545)"
  COLUMNS=250 timeout 400 python3 -m sglfix matrix --profile sglang-0.5.23 --parts -s 'sglang-triton-draft-extend-v2*' \
    --device cuda --json "$OUT/matrix-draft-extend-cuda.json" > "$OUT/matrix-draft-extend-cuda.txt" 2>&1; echo "matrix rc=$?"
  grep -E "^(UNMET|unexpected|27545|sglfix matrix)" "$OUT/matrix-draft-extend-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -12
  save_sglang_caches
  exit 0
fi
if [ "${ONLY:-}" = search ]; then
  # sglfix search on real sglang and real kernels, from the generic space alone: the FlashInfer-MLA
  # multi-step draft planned from seq_lens (the shrunk scenario replayed through run, failing, and
  # with the profile's candidate fix, passing), then a live-bug search per family (SEARCH_FAMILIES)
  # with every worker (FAMILY_TIME seconds of new examples each).
  install_sglang
  S="python3 -m sglfix --profile sglang-0.5.23"
  for f in ${SEARCH_FILES:-}; do
    # A scenario file a search wrote (or its variants), replayed on CUDA twice, nothing served.
    for i in 1 2; do
      COLUMNS=250 $S run --scenario-file "$f" --device cuda --no-cache --all --json "$OUT/replay-$(basename "$f" .yaml)-$i.json" 2>&1 \
        | sed 's/\x1b\[[0-9;]*m//g' | grep -E "^│ [a-z]|^sglfix run" | cut -c1-220; echo "replay $f rc=${PIPESTATUS[0]}"
    done
  done
  if [ "${SEARCH_FIMLA:-1}" = 1 ]; then
  log "search: FlashInfer-MLA draft decode on CUDA"
  COLUMNS=250 timeout ${SEARCH_LIMIT:-300} $S search --family flashinfer_mla --mode DRAFT_DECODE --device cuda \
    --examples ${SEARCH_EXAMPLES:-60} --no-cache --json "$OUT/search-fimla-cuda.json" -o "$OUT/search-fimla-cuda.yaml" 2>&1 \
    | grep -v "^search: [0-9]" | tail -8; echo "search rc=${PIPESTATUS[0]}"
  if [ -f "$OUT/search-fimla-cuda.yaml" ]; then
    COLUMNS=250 $S run --scenario-file "$OUT/search-fimla-cuda.yaml" --device cuda --no-cache \
      --json "$OUT/replay-fimla-cuda.json" 2>&1 | tail -3; echo "replay rc=${PIPESTATUS[0]}"
    COLUMNS=250 $S run --scenario-file "$OUT/search-fimla-cuda.yaml" --device cuda --no-cache \
      --apply profiles/sglang-0.5.23/fixes/fimla-draft-plan.patch --json "$OUT/replay-fimla-fix-cuda.json" 2>&1 | tail -3
    echo "replay with the fix rc=${PIPESTATUS[0]}"
  fi
  fi
  for fam in ${SEARCH_FAMILIES:-flashinfer flashinfer_mla triton}; do
    log "search: a live bug on real kernels, --family $fam"
    # SEARCH_ARGS: more search options (e.g. --where model.head_dim=64: fewer kernels for a cold JIT).
    COLUMNS=250 timeout ${FAMILY_LIMIT:-240} $S search --family "$fam" --device cuda --examples 1000 ${SEARCH_ARGS:-} \
      --time ${FAMILY_TIME:-90} --no-cache --json "$OUT/search-$fam-cuda.json" -o "$OUT/search-$fam-cuda.yaml" 2>&1 \
      | grep -v "^search: [0-9]" | tail -8; echo "search $fam rc=${PIPESTATUS[0]}"
  done
  [ "${SAVE_CACHES:-1}" = 1 ] && save_sglang_caches
  # One archive: a call hands back a few files only.
  (cd "$OUT" && tar -czf search-out.tgz --remove-files ./*.json ./*.yaml sglang-check.* 2>/dev/null)
  exit 0
fi
if [ "${ONLY:-}" = reverts ]; then
  # search --revert over every part a catalogue expects shown on REV_DEVICE (bench/search_bench.py
  # --reverts REV_PROFILES --showable), REV_SHARDS bench processes side by side, each with
  # SGLFIX_JOBS workers and every REV_SHARDS-th part; each shard writes its JSON after every part
  # (merge them with search_bench.py --merge). The searches are bounded by examples, not time, so
  # a faster host gives the same rows sooner.
  install_sglang
  export SGLFIX_JOBS=${SGLFIX_JOBS:-2}
  n=${REV_SHARDS:-4}
  for i in $(seq 1 "$n"); do
    timeout ${REV_LIMIT:-450} python3 bench/search_bench.py --json "$OUT/reverts-$i.json" --reverts ${REV_PROFILES:-sglang-0.5.23} \
      --showable --device ${REV_DEVICE:-cpu} --examples ${REV_EXAMPLES:-200} --shard "$i/$n" > "$OUT/reverts-$i.log" 2>&1 &
  done
  wait
  pkill -f "sglfix" 2>/dev/null || true  # a shard cut short leaves its search and workers behind
  cat "$OUT"/reverts-*.log | grep -E "found|Traceback|Error" | head -60
  (cd "$OUT" && tar -czf reverts-out.tgz --remove-files ./reverts-* 2>/dev/null)
  exit 0
fi
if [ "${ONLY:-}" = scale ]; then
  # Scale-out of a campaign (SCALE_CAMPAIGN: the sglfix command of a mutation campaign over real
  # sglang, e.g. "--profile sglang-0.5.23 mutate --function GLOB"): on 1 GPU, on every GPU and
  # through Ray on them, mutant by mutant compared (bench/scale_out.py --campaign).
  install_ray
  install_sglang
  python3 bench/scale_out.py --json "$OUT/scale-out.json" --logs "$OUT/scale-logs" --budget-s ${SCALE_BUDGET:-470} \
    --campaign "$SCALE_CAMPAIGN" $skip_ray ${SCALE_ARGS:-}; echo "scale rc=$?"
  (cd "$OUT" && tar -czf scale-logs.tgz scale-logs && rm -rf scale-logs)
  [ "${SAVE_CACHES:-0}" = 1 ] && save_sglang_caches
  exit 0
fi
if [ "${ONLY:-}" = survivors ]; then
  # sglfix search --mutant over a campaign's survivors (SURV_REPORT, a mutate --json report or a
  # bench/results summary), SURV_SHARDS bench processes side by side on this host's cores, each with
  # SGLFIX_JOBS workers, on SURV_DEVICE (cpu: the campaign's own device); SURV_ARGS: more
  # bench/search_bench.py options (--examples, --time, --after). Each shard writes its JSON after
  # every mutant, so a shard cut short by SURV_LIMIT keeps what it measured.
  install_sglang
  if [ -n "${SURV_WARM:-}" ]; then
    # One run of a scenario file first, at baseline, so FlashInfer's JIT builds once, not in every
    # shard's first search (a cold shard spent its --time compiling: 12 examples in 60 s, not 21-30).
    # It warms the kernel caches only: each search still draws from its own space.
    log "warm-up: run --scenario-file $SURV_WARM on $SURV_DEVICE"
    COLUMNS=250 timeout ${SURV_WARM_LIMIT:-150} python3 -m sglfix --profile sglang-0.5.23 run --device ${SURV_DEVICE:-cpu} \
      --scenario-file "$SURV_WARM" --all --no-cache > "$OUT/warm.txt" 2>&1; echo "warm-up rc=$?"
  fi
  export SGLFIX_JOBS=${SGLFIX_JOBS:-4}
  n=${SURV_SHARDS:-4}
  for i in $(seq 1 "$n"); do
    timeout ${SURV_LIMIT:-500} python3 bench/search_bench.py --json "$OUT/survivors-$i.json" --survivors "$SURV_REPORT" \
      --skip-family trtllm_mla --device ${SURV_DEVICE:-cpu} --shard "$i/$n" ${SURV_ARGS:-} > "$OUT/survivors-$i.log" 2>&1 &
  done
  wait
  pkill -f "sglfix" 2>/dev/null || true  # a shard cut short leaves its search and workers behind
  grep -c killed "$OUT"/survivors-*.log; tail -n 2 "$OUT"/survivors-*.log
  (cd "$OUT" && tar -czf survivors-out.tgz --remove-files ./survivors-* 2>/dev/null)
  exit 0
fi
if [ "${ONLY:-}" = sglang ] && [ -n "${SG_SCENARIOS:-}" ]; then
  # A chosen part of the real-sglang scenarios (SG_SCENARIOS, sglfix's -s globs), every toggle and
  # part, in one matrix: the new scenarios' CUDA run, compared with the CPU matrix of the same
  # selection afterwards (sglfix report compare).
  install_sglang
  log "real-sglang matrix on CUDA, every part: $SG_SCENARIOS"
  set -f
  COLUMNS=250 timeout ${SHARD_LIMIT:-420} python3 -m sglfix matrix --profile sglang-0.5.23 --parts --device cuda \
    --jobs ${JOBS:-4} $SG_SCENARIOS --json "$OUT/matrix-sglang-sel-cuda.json" > "$OUT/matrix-sglang-sel-cuda.txt" 2>&1
  echo "matrix rc=$?"
  set +f
  grep -E "^(UNMET|unexpected|sglfix matrix)" "$OUT/matrix-sglang-sel-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -15
  exit 0
fi
if [ "${ONLY:-}" = sglang ]; then
  install_sglang
  # In shards (SHARDS="1 2 3" of 3 by default; a later call can run the rest with the caches the
  # earlier one returned), each under a deadline so that the caches are saved whatever happens.
  # Several workers share the GPU: compiling Triton kernels cold is CPU-bound.
  for i in ${SHARDS:-1 2 3}; do
    log "real-sglang matrix on CUDA, every part, shard $i/3 (FlashInfer JIT cache: $JIT at start)"
    t0=$(date +%s)
    COLUMNS=250 timeout ${SHARD_LIMIT:-500} python3 -m sglfix matrix --profile sglang-0.5.23 --parts --device cuda \
      --jobs ${JOBS:-4} --shard $i/3 --json "$OUT/matrix-sglang-cuda-$i.json" > "$OUT/matrix-sglang-cuda-$i.txt" 2>&1
    echo "shard $i rc=$? in $(( $(date +%s) - t0 )) s"
    grep -E "^(UNMET|unexpected|sglfix matrix)" "$OUT/matrix-sglang-cuda-$i.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -15
  done
  ls "$OUT"/matrix-sglang-cuda-*.json >/dev/null 2>&1 && python3 -m sglfix report merge "$OUT"/matrix-sglang-cuda-*.json \
    -o "$OUT/matrix-sglang-cuda.json" --gate > "$OUT/merge.txt" 2>&1; echo "merge --gate rc=$?"; tail -12 "$OUT/merge.txt"
  [ -f "$OUT/matrix-sglang-cuda.json" ] && python3 - "$OUT/matrix-sglang-cuda.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
reps = m.get("worker_replacements") or []
print(f"sglang on cuda: {len(m['cells'])} cells {m['summary']}; ERROR cells: {m['summary'].get('ERROR', 0)}; "
      f"workers replaced: {len(reps)}")
for r in reps:
    print("  replaced:", r[:300])
print("judged:", (m.get("judged") or {}).get("outcome"))
PY
  if [ -f bench/results/matrix-sglang-cpu.json ] && [ -f "$OUT/matrix-sglang-cuda.json" ]; then
    log "parity with the real-sglang CPU matrix"
    python3 -m sglfix report compare bench/results/matrix-sglang-cpu.json "$OUT/matrix-sglang-cuda.json" \
      --json "$OUT/parity-sglang.json" > "$OUT/parity-sglang.txt" 2>&1; echo "parity rc=$?"; tail -30 "$OUT/parity-sglang.txt"
  fi
  # Few files come back from a device call: the logs and the shards go as one tarball.
  (cd "$OUT" && tar -czf sglang-logs.tgz --remove-files sglang-check.* matrix-sglang-cuda-*.json matrix-sglang-cuda-*.txt \
    merge.txt parity-sglang.txt 2>/dev/null)
  save_sglang_caches
  exit 0
fi
if [ "${ONLY:-}" = runner ]; then
  # The one runner (sglfix.execution.runner) on the GPU: the matrix with reachability, compared
  # cell by cell with the committed CUDA matrix; bisect with one worker per GPU (--devices all)
  # and in two shards, its culprits and masking compared with the committed CPU bisect.
  log "matrix on CUDA through the runner, with reachability (FlashInfer JIT cache: $JIT at start)"
  COLUMNS=250 python3 -m sglfix matrix --parts --device cuda --json "$OUT/matrix-cuda-reach.json" > "$OUT/matrix-cuda-reach.txt" 2>&1
  echo "matrix rc=$?"; tail -1 "$OUT/matrix-cuda-reach.txt" | sed 's/\x1b\[[0-9;]*m//g'
  python3 -m sglfix report compare bench/results/matrix-cuda-reach.json "$OUT/matrix-cuda-reach.json" | tail -1
  log "bisect on CUDA, one worker per GPU"
  COLUMNS=250 python3 -m sglfix bisect --devices all --json "$OUT/bisect-cuda.json" > "$OUT/bisect-cuda.txt" 2>&1
  echo "bisect rc=$?"; head -1 "$OUT/bisect-cuda.txt"
  for i in 1 2; do
    COLUMNS=250 python3 -m sglfix bisect --device cuda --shard $i/2 --json "$OUT/bisect-cuda-$i.json" > "$OUT/bisect-cuda-$i.txt" 2>&1
    echo "bisect shard $i rc=$?"
  done
  python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda p: json.load(open(p))
cpu, gpu = load("bench/results/bisect-cpu.json"), load(f"{out}/bisect-cuda.json")
shards = [load(f"{out}/bisect-cuda-{i}.json") for i in (1, 2)]
key = lambda cs: sorted((c["group"], tuple(c["ids"]), c["verdict"], tuple(c["scenarios"])) for c in cs)
mk = lambda ms: sorted((m["group"], m["culprit"], m["masked_by"], tuple(m["scenarios"])) for m in ms)
print(f"bisect --devices all on {gpu['device_name']}: {len(gpu['culprits'])} culprits, {len(gpu['masking'])} masking, "
      f"{gpu['sets_run']} sets, {gpu['cells']} cells in {gpu['wall_s']} s; culprits as on CPU: "
      f"{key(gpu['culprits']) == key(cpu['culprits'])}; masking as on CPU: {mk(gpu['masking']) == mk(cpu['masking'])}")
both = [c for s in shards for c in s["culprits"]]
print(f"two shards: {[s['shard'] for s in shards]}, {[round(s['wall_s'], 1) for s in shards]} s; their culprits together "
      f"as the whole search's: {key(both) == key(gpu['culprits'])}; masking: {mk([m for s in shards for m in s['masking']]) == mk(gpu['masking'])}")
PY
  (cd "$OUT" && tar -czf runner-logs.tgz --remove-files matrix-cuda-reach.txt bisect-cuda*.txt bisect-cuda-1.json bisect-cuda-2.json 2>/dev/null)
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  exit 0
fi
log "matrix on CUDA, every cell run (FlashInfer JIT cache: $JIT at start)"
COLUMNS=250 python3 -m sglfix matrix --parts --no-reachability --device cuda --json "$OUT/matrix-cuda.json" > "$OUT/matrix-cuda.txt" 2>&1
echo "matrix rc=$?"
log "matrix on CUDA again (JIT cache warm), with reachability: unreached cells marked, not run"
COLUMNS=250 python3 -m sglfix matrix --parts --device cuda --json "$OUT/matrix-cuda-reach.json" > "$OUT/matrix-cuda-reach.txt" 2>&1
echo "matrix warm rc=$?"
log "flashinfer probe"
t0=$(date +%s.%N)
python3 bench/flashinfer_probe.py --json "$OUT/flashinfer-probe.json" > "$OUT/flashinfer-probe.txt" 2>&1; rc=$?
grep -v Warning "$OUT/flashinfer-probe.txt" | tail -20
echo "probe rc=$rc $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
save_caches() {
  tar -czf "$OUT/flashinfer-jit.tgz" -C ~/.cache/flashinfer . 2>/dev/null || true
  tar -czf "$OUT/triton-cache.tgz" -C ~/.triton . 2>/dev/null || true
  du -sh "$OUT"/*.tgz
}
if [ "${ONLY:-}" = probe ]; then save_caches; exit 0; fi
log "backend tests on CUDA"
t0=$(date +%s.%N)
python3 -m pytest -q tests/backends -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/pytest-backends.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest-backends.txt" | head -20; tail -1 "$OUT/pytest-backends.txt"
log "doctor"
python3 -m sglfix doctor --json > "$OUT/doctor.json"; echo "doctor rc=$?"

grep -E "^(met|UNMET|unexpected|sglfix matrix)" "$OUT/matrix-cuda.txt" | sed 's/\x1b\[[0-9;]*m//g' | tail -30
grep -E "matrix on" "$OUT/matrix-cuda.txt"
log "parity with the CPU matrix"
python3 bench/parity.py bench/results/matrix-cpu.json "$OUT/matrix-cuda.json" --json "$OUT/parity.json"
echo "parity rc=$?"
log "parity with the previous CUDA matrix (the cells both have)"
python3 bench/parity.py bench/results/matrix-cuda.json "$OUT/matrix-cuda.json" --json "$OUT/parity-prev.json"
echo "parity-prev rc=$?"
log "a cell whose code under test segfaults on CUDA: FAULT, the run completes, no worker left"
python3 bench/fault_probe.py --device cuda --json "$OUT/fault-cuda.json"; echo "fault rc=$?"
save_caches
python3 - "$OUT" "$JIT" <<'PY'
import json, sys
out, jit = sys.argv[1], sys.argv[2]
m = json.load(open(f"{out}/matrix-cuda.json"))
w = json.load(open(f"{out}/matrix-cuda-reach.json"))
print(f"matrix wall: {m['wall_s']} s with the FlashInfer JIT cache {jit} at start (every cell), "
      f"{w['wall_s']} s warm with reachability ({w['summary'].get('NOT_REACHED', 0)} cells not reached)")
full = {c['id']: c['verdict'] for c in m['cells']}
base = {c['scenario']: c['verdict'] for c in m['cells'] if not c['toggles']}
eff = {c['id']: (c['findings'][0]['same_as'] if c['verdict'] == 'NOT_REACHED' else c['verdict']) for c in w['cells']}
print("reachability changes no verdict:", eff == full, "; unreached cells equal to their baseline:",
      all(full[c['id']] == base[c['scenario']] for c in w['cells'] if c['verdict'] == 'NOT_REACHED'))
p = json.load(open(f"{out}/parity.json"))
q = json.load(open(f"{out}/parity-prev.json"))
f = json.load(open(f"{out}/fault-cuda.json"))
print(f"{'cells':>8} {'wall_s':>8} {'agree':>6} {'differ':>6} {'prev-agree':>10} {'prev-differ':>11}  summary")
print(f"{len(m['cells']):>8} {m['wall_s']:>8} {p['agree']:>6} {len(p['differ']):>6} {q['agree']:>10} {len(q['differ']):>11}  {m['summary']}")
print("fault probe:", [(c['cell'], c['verdict'], c['seconds']) for c in f['cells']], "workers left", f['workers_left'])
PY
# The device returns at most 8 files: the two matrix reports and the caches as they are, the rest
# in one archive.
(cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.tgz' --exclude='matrix-cuda.json' --exclude='matrix-cuda-reach.json' . \
  && find . -maxdepth 1 -type f ! -name '*.tgz' ! -name 'matrix-cuda.json' ! -name 'matrix-cuda-reach.json' -delete \
  && mv /tmp/logs.tgz .)
ls "$OUT"
