#!/usr/bin/env bash
# One call on the GPU machine: install, then the named steps (GPU tests, acceptance run, engine
# sweep, variants, cmt bench, cmt tune). Results land in $OUT (the device tool brings them back).
#   bash benchmarks/gpu_session.sh gputests core sweep
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cmt-out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; nproc;
  grep -m1 "model name" /proc/cpuinfo; lscpu | grep -iE "cache|numa" ; date -u; } 2>&1 | tee "$OUT/machine.txt"
python3 -m pip install --no-build-isolation --no-deps . > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
for step in "$@"; do
  echo "== $step"
  case "$step" in
    gputests) timeout 420 python3 -m pytest -m gpu tests/gpu -q -x -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -15 ;;
    core) timeout 300 python3 benchmarks/core_acceptance.py --out "$OUT/core-acceptance.json" 2>&1 | tail -25 ;;
    variants) timeout 300 python3 benchmarks/explore_variants.py "$OUT/variants.json" 2>&1 | tail -8 ;;
    sweep) timeout 300 python3 benchmarks/explore_engine.py --out "$OUT/engine-sweep.json" 2>&1 | grep -E "size|best" ;;
    *) echo "unknown step $step" ;;
  esac
done
