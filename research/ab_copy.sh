#!/usr/bin/env bash
# A/B of environments over several processes: `cmt bench copy` (pinned against cmt) once per
# environment per round, the environments taken in turn, then the median, min and max of cmt / pinned
# per environment (ratio_table.py). One process's figures spread by up to 8 points on the H200 host,
# so engine settings and tuned files were compared this way (benchmarks/results/*/ab-*/).
#   bash research/ab_copy.sh OUT_DIR NAME=[VAR=VALUE[,VAR=VALUE...]] ...
#   e.g. bash research/ab_copy.sh "$OUT/ab" shipped= t12=CMT_CONFIG=rules-t12.json
# AB_ROUNDS (3), AB_SIZES (16M,64M,256M,1G) and AB_DIRECTIONS (h2d,d2h) choose what runs.
set -uo pipefail
here=$(dirname "$0")
out=$1
shift
mkdir -p "$out"
for round in $(seq "${AB_ROUNDS:-3}"); do
  for v in "$@"; do
    name=${v%%=*} vars=${v#*=}
    d="$out/$name/run$round"
    env ${vars//,/ } timeout 150 python3 -m cmt bench copy --sizes "${AB_SIZES:-16M,64M,256M,1G}" \
      --modes pinned,cmt --directions "${AB_DIRECTIONS:-h2d,d2h}" --no-plot --out "$d" >/dev/null 2>&1 ||
      echo "$name round $round failed"
    python3 "$here/ratio_table.py" "$name" "$d/copy.json"
  done
done
python3 "$here/ratio_table.py" --summary "$out"/*/run*/copy.json | tee "$out/summary.txt"
