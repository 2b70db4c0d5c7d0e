#!/usr/bin/env bash
# The one script run on the GPU machine, from the repository root; its files land in $OUT (which the
# device tool brings back: at most 8 files). Modes, run in the order given:
#   install  python3 -m pip install --no-build-isolation --no-deps .   (-> install.log)
#   tests    the GPU tests, pytest -m gpu -v; TESTS_K selects (-k)      (-> gpu-tests.log)
#   core     benchmarks/core_acceptance.py, $PROCESSES (default 3) plain and cmt processes in turn
#                                                                      (-> core-acceptance.json)
#   firstuse the same, only each process's first copies, $PROCESSES (default 5)  (-> first-use.json)
#   small    only the 4 KiB pass-through copies of core, $PAIRS (default 7) plain and cmt processes in
#            turn                                                      (-> small-copies.json)
#   firstcopies  research/first_copies.py, $ROUNDS (default 3) processes each: plain, under cmt run (CMT_LOG=debug: the
#            setup's time and pauses), and under cmt run with no staging faulted in at the context
#            (test hook reserve=0)                                     (-> first-copies.txt)
#   hfspan   research/hf_copy_span.py on the full hf-load model, 3 processes plain and 3 under cmt run
#            in turn: the call's time against its copies' (the ceiling of its speed-up) (-> hf-span.txt)
#   mappedwarm  research/mapped_warm.py, 3 processes plain and 3 under cmt run in turn: one thread's
#            32 MiB copies to the GPU out of a warm file mapping (fresh, its pages touched, private)
#            and out of memory                                         (-> mapped-warm.txt)
#   copy     cmt bench copy, the full sweep                            (-> copy.json, copy.png)
#   load     cmt bench load, every scenario over 3 process pairs (about 6.5 minutes; stopped at 8:
#            `install load` fits one call, not beside other modes; LOAD_ARGS narrows it, e.g.
#            '--scenarios busy --busy 0,12 --sizes 1M,16M')              (-> load.json, load.png)
#   doctor   cmt doctor --path . (text and JSON)                      (-> doctor.txt, doctor.json)
#   io       cmt bench io in a scratch folder, 4 GiB: warm and cold reads, writes, the batch, the
#            disk's O_DIRECT limit, one and 16 threads, against KvikIO where carried; IO_ARGS replaces
#            the threads, sizes and types (-> io.json, io.png)
#   ioacc    benchmarks/io_acceptance.py: read_async's return time on a busy stream, first-use setup
#                                                                      (-> io-acceptance.json)
#   streamcheck  research/stream_io_hang.py: read_async on a busy stream, once and in a loop, 1 GiB; a
#            child that hangs gets cuda-gdb's backtraces                 (-> streamcheck.log)
#   coldread research/cold_read_modes.cpp (g++, CPU only) on a 4 GiB file in /tmp/cmt-io, made if missing and
#            removed after: cold reads buffered / O_DIRECT / io_uring by threads, I/O size and queue depth,
#            2 runs each, none started after COLD_SECONDS (default 240) s; about 5 minutes in all
#                                                      (-> cold-read-modes.json, cold-read-modes.txt)
#   colddepth  research/cold_depth.py: cold whole-file reads of 3.6 GiB in fresh processes taken in turn,
#            cmt.io with 4x8, 16x8, 16x16 and 32x8 MiB of staging in flight against fastsafetensors'
#            own load, $ROUNDS (default 2) rounds, about 2 minutes; CONFIGS=4x8,fst,... for some
#            (e.g. 2x8,32x0.5/piece=524288/cold_buffers=0,fst: fastsafetensors' geometry in the engine)
#                                                                      (-> cold-depth.txt)
#   fullprofile  the full-size hf-load (3.8 GB from_pretrained) and safetensors-cuda (2 GiB load_file) workloads
#            under cmt profile, each with its trace, then with every copy passed to the driver (--passthrough):
#            each copy's and pinning call's time, and how long a copy was in flight, staged and plain
#                                        (-> NAME-profile.txt, NAME-trace.json, NAME-profile-plain.txt)
#   turns    research/threads_turns.py under cmt run: 8 threads' 64 MiB copies at once against one
#            thread's back to back, the spacing of their returns         (-> turns.txt)
#   frameworks  cmt bench workloads of the libraries that stage their own copies (safetensors-cuda,
#            cupy, seed-jax, hf-load), then each once under cmt profile (-> workloads.json,
#            frameworks-profile.txt)
#   setup    the engine's setup under CMT_LOG=debug: research/load_setup.py (where a warm
#            cmt.io.load_safetensors spends its time; then a fresh process's first load with 4 and 8
#            staging buffers, twice each, warm and cold, and with 8 twice under cmt run), then the quick hf-load and cupy
#            workloads twice each under cmt run with CMT_STATS, with staging faulted in ahead and without
#            (after frameworks, whose files they reuse)                 (-> setup-debug.txt)
#   jax      research/jax_asarray.py plain and under cmt run, each also with glibc's malloc on huge pages,
#            then with research/large_calls_probe.c (which large memset/memcpy/allocation takes the faults),
#            research/fill_bench.c plainly and under cmt (large fills of fresh memory),
#            then under cmt profile: np.asarray's time, page faults and pinning calls (-> jax-asarray.txt)
#   loadcold the cold model-load of cmt.io and of fastsafetensors, twice each in turn, under CMT_LOG=debug
#            and CMT_STATS=1 (where cmt.io's cold load loses time its cold read does not) (-> load-cold.txt)
#   coldturns  the cold model-load of each of $LOADERS (default cmt-io,fastsafetensors,runai), one fresh
#            process each, $ROUNDS (default 4) rounds in turn, each round in a turned order; then each
#            loader's median (the comparison issue 24 asks for, without cmt run's half)  (-> cold-turns.txt)
#   models   cmt bench workloads of the model-load family (every loader warm and cold, the C++ loader);
#            QUICK=1 for the 0.5 GB model; CACHE=warm or cold for half (the whole family at 3.9 GB may
#            not fit one call); ONLY=NAME,... for those workloads     (-> workloads.json)
#   all      install tests core copy (about 8 minutes with 3 processes)
# Wheels carried in .whl/ (kvikio-cu13, libkvikio-cu13, rapids-logger, fastsafetensors, instanttensor,
# runai-model-streamer: ../.library/device/README.md) are installed into /tmp/site first.
# e.g.  bash benchmarks/gpu_session.sh all
#       PROCESSES=5 bash benchmarks/gpu_session.sh install core     (5 processes take about 6.5 minutes)
# Every call also writes machine.txt. Exit status: 1 if any mode failed.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cmt-out}
mkdir -p "$OUT"
# in_turn SECONDS CMD...: CMD plainly, then under cmt run, 3 times, each stopped after SECONDS; the
# JSON lines each process prints, under "== plain" / "== cmt".
in_turn() {
  local s=$1; shift
  for k in 1 2 3; do
    echo "== plain"; timeout "$s" "$@" 2>&1 | grep "^{"
    echo "== cmt"; timeout "$s" python3 -m cmt run -- "$@" 2>&1 | grep "^{"
  done
}
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; nproc
  grep -m1 "model name" /proc/cpuinfo; lscpu | grep -iE "L3|numa node\("; date -u; } > "$OUT/machine.txt" 2>&1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
modes=()
for m in "$@"; do if [ "$m" = all ]; then modes+=(install tests core copy); else modes+=("$m"); fi; done
[ ${#modes[@]} -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | grep '^#'; exit 2; }
status=0
for mode in "${modes[@]}"; do
  echo "== $mode $(date -u +%T)"
  case "$mode" in
    install) python3 -m pip install --no-build-isolation --no-deps . > "$OUT/install.log" 2>&1 ||
               { tail -30 "$OUT/install.log"; exit 1; } ;;
    tests) timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -m gpu tests -v --tb=short -p no:cacheprovider \
             ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" ;;
    core) timeout 580 python3 benchmarks/core_acceptance.py --processes "${PROCESSES:-3}" \
            --out "$OUT/core-acceptance.json" 2>&1 | tail -30 ;;
    firstuse) timeout 300 python3 benchmarks/core_acceptance.py --first-use --processes "${PROCESSES:-5}" \
                --out "$OUT/first-use.json" 2>&1 | tail -12 ;;
    small) timeout 300 python3 benchmarks/core_acceptance.py --small-only --small-pairs "${PAIRS:-7}" \
             --out "$OUT/small-copies.json" 2>&1 | tail -5 ;;
    firstcopies) { for k in $(seq "${ROUNDS:-3}"); do
                     echo "== plain"; timeout 60 python3 research/first_copies.py
                     echo "== cmt"; CMT_LOG=debug CMT_STATS=1 timeout 60 python3 -m cmt run -- python3 research/first_copies.py
                     echo "== cmt reserve=0"; CMT_TEST_HOOKS=reserve=0 CMT_LOG=debug CMT_STATS=1 timeout 60 \
                       python3 -m cmt run -- python3 research/first_copies.py
                   done; } 2>&1 | tee "$OUT/first-copies.txt" | grep -E "==|first|later|again|set up" | cut -c1-180 ;;
    hfspan) mkdir -p /tmp/cmt-fw
            s=$(python3 -c "from cmt.bench import workloads as w; print(w.select('hf-load')[0].path)")
            python3 "$s" --prepare --work-dir /tmp/cmt-fw > /dev/null 2>&1
            in_turn 90 python3 research/hf_copy_span.py /tmp/cmt-fw | tee "$OUT/hf-span.txt" ;;
    mappedwarm) mkdir -p /tmp/cmt-io
                in_turn 60 python3 research/mapped_warm.py /tmp/cmt-io | tee "$OUT/mapped-warm.txt" ;;
    copy) timeout 200 python3 -m cmt bench copy --out "$OUT" 2>&1 | tail -45 ;;
    load) COLUMNS=150 timeout ${LOAD_TIMEOUT:-480} python3 -m cmt bench load ${LOAD_ARGS:-} --out "$OUT" 2>&1 | tail -100 ;;
    doctor) COLUMNS=150 python3 -m cmt doctor --path . > "$OUT/doctor.txt" 2>&1; cat "$OUT/doctor.txt"
            python3 -m cmt doctor --path . --json > "$OUT/doctor.json" 2>&1; true ;;
    io) mkdir -p /tmp/cmt-io && COLUMNS=150 timeout ${IO_TIMEOUT:-480} python3 -m cmt bench io -D /tmp/cmt-io \
          ${IO_ARGS:--w 1,16 -i all -x cpu-gpu,cpu-pinned-gpu,cmt,kvikio} --out "$OUT" 2>&1 | tail -80 ;;
    ioacc) mkdir -p /tmp/cmt-io && timeout 200 python3 benchmarks/io_acceptance.py --dir /tmp/cmt-io \
             --out "$OUT/io-acceptance.json" 2>&1 | tail -20 ;;
    streamcheck) mkdir -p /tmp/cmt-hang && HANG_MB=1024 timeout 200 python3 research/stream_io_hang.py /tmp/cmt-hang \
                   test,loop 2>&1 | grep -v "^cmt\[" | tee "$OUT/streamcheck.log" | tail -40 ;;
    coldread) mkdir -p /tmp/cmt-io && g++ -O2 -std=c++17 -pthread -o /tmp/cold_read_modes research/cold_read_modes.cpp &&
                { timeout $(( ${COLD_SECONDS:-240} + 150 )) /tmp/cold_read_modes /tmp/cmt-io/cold-read-4g.bin --make 4G \
                    --seconds-max "${COLD_SECONDS:-240}" --json "$OUT/cold-read-modes.json" > "$OUT/cold-read-modes.txt"
                  rc=$?; cat "$OUT/cold-read-modes.txt"; rm -f /tmp/cmt-io/cold-read-4g.bin /tmp/cmt-io/cold-read-4g.bin.making
                  [ $rc -eq 0 ]; } ;;
    colddepth) mkdir -p /tmp/cmt-io && { stat -f -c "file system: %T" /tmp/cmt-io
                 timeout 300 python3 research/cold_depth.py /tmp/cmt-io ${CONFIGS:+--configs $CONFIGS} \
                   --rounds "${ROUNDS:-2}" 2>&1 | grep -v "^cmt\["; } | tee "$OUT/cold-depth.txt" ;;
    fullprofile) mkdir -p /tmp/cmt-fw
               for w in hf-load safetensors-cuda; do
                 s=$(python3 -c "from cmt.bench import workloads as w; print(w.select('$w')[0].path)")
                 python3 "$s" --prepare --work-dir /tmp/cmt-fw > /dev/null 2>&1  # (its files written: in the page cache)
                 COLUMNS=150 timeout 150 python3 -m cmt profile --trace "$OUT/$w-trace.json" -- python3 "$s" \
                   --work-dir /tmp/cmt-fw > "$OUT/$w-profile.txt" 2>&1
                 COLUMNS=150 timeout 150 python3 -m cmt profile --passthrough -- python3 "$s" --work-dir /tmp/cmt-fw \
                   > "$OUT/$w-profile-plain.txt" 2>&1
                 grep -E "inner_s|copies|in flight|pin|pageable" "$OUT/$w-profile.txt" "$OUT/$w-profile-plain.txt" | cut -c1-200
               done ;;
    turns) CMT_STATS=1 timeout 200 python3 -m cmt run -- python3 research/threads_turns.py 2>&1 | tee "$OUT/turns.txt" | tail -30 ;;
    frameworks) fw=safetensors-cuda,cupy,seed-jax,hf-load
                COLUMNS=150 timeout 500 python3 -m cmt bench workloads --only $fw --rounds ${ROUNDS:-3} \
                  --out "$OUT" 2>&1 | tail -40
                # each once more under cmt profile (--quick sizes): its copies, and what cmt did with each
                mkdir -p /tmp/cmt-fw
                for s in $(python3 -c "from cmt.bench import workloads as w; print(*(x.path for x in w.select('$fw')))"); do
                  echo "=== $s"; python3 "$s" --quick --prepare --work-dir /tmp/cmt-fw > /dev/null 2>&1
                  COLUMNS=150 timeout 120 python3 -m cmt profile -- python3 "$s" --quick --work-dir /tmp/cmt-fw 2>&1
                done > "$OUT/frameworks-profile.txt"; grep -A3 -i "host copies\|by library" "$OUT/frameworks-profile.txt" | head -40 ;;
    setup) mkdir -p /tmp/cmt-io /tmp/cmt-fw
           { CMT_LOG=debug timeout 100 python3 research/load_setup.py /tmp/cmt-io
             for b in 4 8 4 8; do CMT_LOG=debug timeout 60 python3 research/load_setup.py /tmp/cmt-io --first-buffers $b; done
             for b in 4 8 4 8; do CMT_LOG=debug timeout 60 python3 research/load_setup.py /tmp/cmt-io --first-buffers $b --cold; done
             for b in 8 8; do echo "== under cmt run"  # its staging faulted in while the context is made
               CMT_LOG=debug timeout 60 python3 -m cmt run -- python3 research/load_setup.py /tmp/cmt-io --first-buffers $b; done
             for w in hf-load cupy hf-load cupy; do
               s=$(python3 -c "from cmt.bench import workloads as w; print(*(x.path for x in w.select('$w')))")
               python3 "$s" --quick --prepare --work-dir /tmp/cmt-fw > /dev/null 2>&1
               for r in 1 0; do  # staging faulted in ahead or not (test hook reserve=0)
                 echo "== $w reserve=$r"
                 CMT_TEST_HOOKS=reserve=$r CMT_LOG=debug CMT_STATS=1 timeout 60 python3 -m cmt run -- \
                   python3 "$s" --quick --work-dir /tmp/cmt-fw 2>&1 | grep -vE "Loading weights|plan:"
               done
             done; } > "$OUT/setup-debug.txt" 2>&1
           grep -E "set up|ahead|waits|inner|==|warming|accelerated|buffers" "$OUT/setup-debug.txt" | cut -c1-200 ;;
    jax) { timeout 100 python3 research/jax_asarray.py; timeout 100 python3 -m cmt run -- python3 research/jax_asarray.py
           # glibc's malloc on transparent huge pages (XLA's fresh host buffer faults in 4 KiB at a time)
           echo "== GLIBC_TUNABLES=glibc.malloc.hugetlb=1"; export GLIBC_TUNABLES=glibc.malloc.hugetlb=1
           timeout 100 python3 research/jax_asarray.py; timeout 100 python3 -m cmt run -- python3 research/jax_asarray.py
           unset GLIBC_TUNABLES
           echo "== large-calls probe"; gcc -O2 -shared -fPIC -o /tmp/probe.so research/large_calls_probe.c -ldl -lpthread &&
             LD_PRELOAD=/tmp/probe.so timeout 100 python3 research/jax_asarray.py
           echo "== fill_bench 512 MiB, plain then cmt, 3 processes each in turn"
           gcc -O2 -o /tmp/fill_bench research/fill_bench.c -l:libcuda.so.1 && for k in 1 2 3; do echo plain; /tmp/fill_bench 512
             echo cmt; LD_PRELOAD=$(python3 -c "from cmt.native import library_path; print(library_path())") /tmp/fill_bench 512; done
           COLUMNS=150 timeout 100 python3 -m cmt profile -- python3 research/jax_asarray.py; } \
           2>&1 | grep -v "^cmt\[" | tee "$OUT/jax-asarray.txt" ;;
    loadcold) mkdir -p /tmp/cmt-fw
              s=$(python3 -c "from cmt.bench import workloads as w; print(w.select('model-load-cmt-io-cold')[0].path)")
              timeout 90 python3 "$s" --loader cmt-io --cache cold --work-dir /tmp/cmt-fw --prepare > /dev/null 2>&1
              for k in 1 2; do for l in cmt-io fastsafetensors; do
                echo "== $l"; CMT_LOG=debug CMT_STATS=1 timeout 60 python3 "$s" --loader $l --cache cold --work-dir /tmp/cmt-fw 2>&1 |
                  grep -v "plan:" | cut -c1-300
              done; done | tee "$OUT/load-cold.txt" | grep -E "^==|inner|set up" | cut -c1-200 ;;
    coldturns) mkdir -p /tmp/cmt-fw
              s=$(python3 -c "from cmt.bench import workloads as w; print(w.select('model-load-cmt-io-cold')[0].path)")
              timeout 90 python3 "$s" --loader cmt-io --cache cold --work-dir /tmp/cmt-fw --prepare > /dev/null 2>&1
              IFS=, read -ra ls <<< "${LOADERS:-cmt-io,fastsafetensors,runai}"
              for k in $(seq 0 $(( ${ROUNDS:-4} - 1 ))); do for i in "${!ls[@]}"; do l=${ls[$(( (i + k) % ${#ls[@]} ))]}
                t=$(timeout 60 python3 "$s" --loader "$l" --cache cold --work-dir /tmp/cmt-fw 2>&1 |
                    grep -o '"inner_s": [0-9.]*' | cut -d' ' -f2)
                echo "$l ${t:-failed} $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
              done; done | tee "$OUT/cold-turns.txt"
              python3 -c 'import statistics, sys, collections
r = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[1] != "failed": r[f[0]].append(float(f[1]))
for l, v in r.items(): print(f"{l}: median {statistics.median(v):.2f} s over {len(v)} ({min(v):.2f}-{max(v):.2f})")' \
                "$OUT/cold-turns.txt" | tee -a "$OUT/cold-turns.txt" ;;
    models) only=${ONLY:-$(python3 -c 'import os; from cmt.bench import workloads as w; c = os.environ.get("CACHE", "")
print(",".join(n for n in w.names() if n.startswith("model-load") and n.endswith(c)))')}
            COLUMNS=150 timeout 540 python3 -m cmt bench workloads --only "$only" ${QUICK:+--quick} ${ROUNDS:+--rounds $ROUNDS} --out "$OUT" 2>&1 |
              tail -40 ;;
    *) echo "unknown mode $mode (install, tests, core, firstuse, copy, load, doctor, io, ioacc, streamcheck, coldread, colddepth, fullprofile, turns, small, firstcopies, hfspan, mappedwarm, frameworks, setup, jax, loadcold, coldturns, models, all)"; false ;;
  esac || { status=1; echo "== $mode failed"; }
done
ls -l "$OUT"
exit $status
