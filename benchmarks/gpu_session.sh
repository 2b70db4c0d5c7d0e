#!/usr/bin/env bash
# One call on the GPU machine: install cmt, run the named steps, pack every result into
# $OUT/results.tar.gz (the device tool brings back at most 8 files) and print short summaries.
#   bash benchmarks/gpu_session.sh gputests core benchcopy
# Steps: gputests torchtests core coretuned benchcopy workloads profiles tune (= tuneinstant tunefull tunedcopy)
#        overhead variants sweep timeline timelinecold pinned ramp fill entry passthrough register abcopy. The archive is rewritten after every step: a call cut short by its
#        time limit still brings back the steps it finished.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cmt-out}
R=${R:-/tmp/cmt-results}
mkdir -p "$OUT" "$R"
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; nproc;
  grep -m1 "model name" /proc/cpuinfo; lscpu | grep -iE "L3|numa node\(" ; date -u; } 2>&1 | tee "$R/machine.txt"
python3 -m pip install --no-build-isolation --no-deps . > "$R/install.log" 2>&1 || { tail -30 "$R/install.log"; exit 1; }
WORKLOADS=python/cmt/bench/workloads
steps=()
for s in "$@"; do if [ "$s" = tune ]; then steps+=(tuneinstant tunefull tunedcopy); else steps+=("$s"); fi; done
for step in "${steps[@]}"; do
  echo "== $step $(date -u +%T)"
  case "$step" in
    gputests) timeout 400 python3 -m pytest -m gpu tests -q -x -p no:cacheprovider 2>&1 | tee "$R/gpu-tests.log" | tail -8 ;;
    torchtests) timeout 200 python3 -m pytest -m gpu tests/gpu/test_gpu_profile.py -k "profile or torch" -q -x \
      -p no:cacheprovider tests/gpu/test_gpu_frameworks.py 2>&1 | tee "$R/gpu-tests-torch.log" | tail -8 ;;
    core) timeout 420 python3 benchmarks/core_acceptance.py --out "$R/core-acceptance.json" 2>&1 | tail -16 ;;
    coretuned)  # the acceptance under tunefull's file
      CMT_CONFIG="$R/tuned-full.json" timeout 420 python3 benchmarks/core_acceptance.py \
        --out "$R/core-acceptance-tuned.json" 2>&1 | tail -16 ;;
    benchcopy) timeout 150 python3 -m cmt bench copy --out "$R/copy" 2>&1 | tail -40 ;;
    workloads) timeout 420 python3 -m cmt bench workloads --out "$R/workloads" 2>&1 | tail -20 ;;
    profiles)
      mkdir -p "$R/profiles"
      for w in torch_tensor hf_load dcp_async_save; do
        python3 "$WORKLOADS/$w.py" --prepare --work-dir /tmp/cmt-work > /dev/null 2>&1
        timeout 120 python3 -m cmt profile --out "$R/profiles/$w.cmtprof" --chart "$R/profiles/$w.png" \
          --trace "$R/profiles/$w.trace.json" -- python3 "$WORKLOADS/$w.py" --work-dir /tmp/cmt-work \
          > "$R/profiles/$w.txt" 2>&1
        head -30 "$R/profiles/$w.txt"
      done ;;
    tuneinstant) timeout 30 python3 -m cmt tune --search instant --out "$R/tuned-instant.json" 2>&1 | tail -25 ;;
    tunefull) timeout 240 python3 -m cmt tune --search full --out "$R/tuned-full.json" 2>&1 | tail -25 ;;
    tunedcopy)  # the tuned files of tuneinstant/tunefull, or of an earlier call (copied into $R)
      for t in instant full; do
        timeout 150 python3 -m cmt bench copy --config "$R/tuned-$t.json" --modes pageable,pinned,cmt \
          --directions h2d,d2h --out "$R/copy-tuned-$t" 2>&1 | tail -22
      done ;;
    overhead) timeout 120 python3 benchmarks/profile_overhead.py --out "$R/profile-overhead.json" 2>&1 | tail -4 ;;
    variants) timeout 300 python3 benchmarks/explore_variants.py "$R/variants.json" 2>&1 | tail -8 ;;
    timeline) timeout 300 python3 benchmarks/explore_timeline.py ${TIMELINE_ARGS:-} \
      --out "$R/timeline.json" 2>&1 | tail -80 ;;
    timelinecold)  # sources used in turn from 8 buffers: not in the CPU's caches
      timeout 200 python3 benchmarks/explore_timeline.py --rotate 8 --variants default \
        --out "$R/timeline-cold.json" 2>&1 | tail -30 ;;
    pinned)  # the DMA's rate by pinned memory's origin, and under CPU memory load
      nvcc -O2 -Xcompiler -mavx2,-mcldemote,-mclflushopt -o /tmp/explore_pinned benchmarks/explore_pinned.cpp -lcuda -lpthread &&
        timeout 200 /tmp/explore_pinned | tee "$R/pinned.jsonl" ;;
    ramp)  # the DMA rate of a ramp of blocks by what the CPU did to the staging slots just before
      nvcc -O2 -Xcompiler -mavx2,-mclflushopt -o /tmp/explore_ramp benchmarks/explore_ramp.cpp -lcuda -lpthread &&
        timeout 120 /tmp/explore_ramp | tee "$R/ramp.jsonl" ;;
    fill)  # the CPU's fill rate of the staging ring alone, by lanes, staging pages, source and copy loop
      nvcc -O2 -Xcompiler -mavx2 -o /tmp/explore_fill benchmarks/explore_fill.cpp -lcuda -lpthread &&
        timeout 200 /tmp/explore_fill | tee "$R/fill.jsonl" | python3 benchmarks/fill_table.py ;;
    entry)  # 64 MiB host-to-device under cmt run reached through PyTorch and the C API, legacy and side streams
      timeout 200 python3 benchmarks/explore_entry.py --variants "${ENTRY_VARIANTS:-default,entry-stream}" --out "$R/entry.json" 2>&1 | tail -6 ;;
    passthrough)  # pinned cudaMemcpy (passed through) in alternating plain and cmt run processes
      timeout 200 python3 benchmarks/explore_passthrough.py --out "$R/passthrough.jsonl" 2>&1 | tail -10 ;;
    register)  # page-locking the program's own buffer for one copy: register, DMA, unregister
      nvcc -O2 -o /tmp/explore_register benchmarks/explore_register.cpp -lcuda -lpthread &&
        timeout 150 /tmp/explore_register | tee "$R/register.jsonl" ;;
    abcopy)  # bench copy pinned vs cmt, one process per environment of AB_VARIANTS (VAR=V[,VAR=V]) per round
      for round in $(seq "${AB_ROUNDS:-2}"); do
        for v in ${AB_VARIANTS:-CMT_RAMP_TAIL=0 CMT_RAMP_TAIL=1}; do
          d="$R/ab/$(echo "$v" | tr ",/" "__")/run$round"
          env ${v//,/ } timeout 100 python3 -m cmt bench copy --sizes "${AB_SIZES:-16M,64M,256M,1G}" --modes pinned,cmt \
            --directions "${AB_DIRECTIONS:-h2d,d2h}" --no-plot --out "$d" > /dev/null 2>&1 || echo "abcopy $v round $round failed"
          python3 benchmarks/ratio_table.py "$v" "$d/copy.json"
        done
      done
      python3 benchmarks/ratio_table.py --summary "$R"/ab/*/run*/copy.json | tee "$R/ab/summary.txt" ;;
    sweep) timeout 300 python3 benchmarks/explore_engine.py --out "$R/engine-sweep.json" 2>&1 | grep -E "size|best" ;;
    *) echo "unknown step $step" ;;
  esac
  tar -C "$R" -czf "$OUT/results.tar.gz.part" . && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
done
ls -la "$OUT"
