#!/usr/bin/env bash
# One call on the GPU machine: install, then the named steps. Results land in $OUT (the device
# tool brings back at most 8 files, two folders deep).
#   bash benchmarks/gpu_session.sh gputests core benchcopy profile workloads
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cmt-out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; nproc;
  grep -m1 "model name" /proc/cpuinfo; lscpu | grep -iE "L3|numa node\(" ; date -u; } 2>&1 | tee "$LOG"
python3 -m pip install --no-build-isolation --no-deps . > /tmp/install.log 2>&1 || { tail -30 /tmp/install.log; exit 1; }
for step in "$@"; do
  echo "== $step $(date -u +%T)" | tee -a "$LOG"
  case "$step" in
    gputests) timeout 90 python3 -m pytest -m gpu tests/gpu -q -x -p no:cacheprovider 2>&1 | tail -15 | tee -a "$LOG" ;;
    core) timeout 110 python3 benchmarks/core_acceptance.py --out "$OUT/core-acceptance.json" 2>&1 | tail -16 ;;
    variants) timeout 300 python3 benchmarks/explore_variants.py "$OUT/variants.json" 2>&1 | tail -8 ;;
    sweep) timeout 300 python3 benchmarks/explore_engine.py --out "$OUT/engine-sweep.json" 2>&1 | grep -E "size|best" ;;
    benchcopy) timeout 110 python3 -m cmt bench copy --out "$OUT/c" 2>&1 | tail -40 | tee -a "$LOG" ;;
    profile) mkdir -p "$OUT/p"; timeout 45 python3 -m cmt profile --chart "$OUT/p/profile.png" -- python3 \
               python/cmt/bench/workloads/torch_tensor.py > "$OUT/p/profile.txt" 2>&1; tail -30 "$OUT/p/profile.txt" ;;
    workloads) timeout 150 python3 -m cmt bench workloads --only torch-tensor,seed-torch,dcp-async-save,hf-load \
                 --out "$OUT/w" 2>&1 | tail -25 | tee -a "$LOG" ;;
    *) echo "unknown step $step" ;;
  esac
done
