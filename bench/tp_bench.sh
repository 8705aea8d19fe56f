#!/usr/bin/env bash
# Tensor-parallel benchmark: meshtrain with parallel.tp = 2 (2 ranks x 1 thread, shm) against one
# rank with 1 thread and one rank with 2 threads, on the same global batch. PyTorch 1.13 (the
# version Debian 12 ships) has no tensor parallelism, so there is no PyTorch peer.
#
# Usage: bench/tp_bench.sh [BUILD] [--configs "b w"] [--rounds R] [--steps-b N] [--steps-w N]
#                          [--warmup W] [--cases "tp2 tp2sp one1 one2"] [--blas-core NAME|native]
# Cases:
#   tp2     meshrun --nproc-per-node 2, parallel.tp = 2, train.threads = 1, dist.backend = shm
#   tp2sp   the same with parallel.sequence_parallel = true
#   one1    meshtrain on one rank, train.threads = 1
#   one2    meshtrain on one rank, train.threads = 2
# Configs: b: 6 layers, n_embd 384, 6 heads, block 256, batch 4, vocab 257;
#          w: 6 layers, n_embd 768, 12 heads, block 256, batch 4, vocab 257.
# Each round runs every case once; the order rotates by one case from round to round. A case
# that fails prints the tail of its log and is left out of that config; a tp run whose start
# line does not name tensor parallelism counts as failed. Figures: tokens/s (global tokens per
# step / median step_s of rank 0's metrics.jsonl after the warm-up). One JSON line per
# measurement, then the medians per case and the ratios (tp2 / one1, goal >= 1.6x; tp2 / one2),
# as the ratio of the medians and as the median (min-max) of the per-round ratios.
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ALL_CASES="tp2 tp2sp one1 one2"
CONFIGS="b w"
ROUNDS=3
STEPS_B=12
STEPS_W=8
WARMUP=3
CASES=$ALL_CASES
BLAS_CORE=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --configs) CONFIGS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps-b) STEPS_B=$2; shift 2 ;;
    --steps-w) STEPS_W=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --blas-core) BLAS_CORE=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tp_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=tp_bench
STEPS_A=$STEPS_B # the shared helpers read it; config a is not run here
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
check_cases "$ALL_CASES" "$CASES"
# This benchmark's configs: b as in the others, and w, b at width 768.
config_shape() {
  case $1 in
    b) echo "6 384 6 256 4" ;;
    w) echo "6 768 12 256 4" ;;
    *) echo "$BENCH_NAME: unknown config $1 (b or w)" >&2; exit 2 ;;
  esac
}
config_steps() { [[ $1 == w ]] && echo "$STEPS_W" || echo "$STEPS_B"; }
apply_blas_core "$BLAS_CORE"
for cfg in $CONFIGS; do config_shape "$cfg" > /dev/null; done
if [[ ! -x $BUILD/meshtrain || ! -x $BUILD/meshrun ]]; then
  echo "tp_bench: $BUILD/meshtrain or $BUILD/meshrun is missing; build them first" \
    "(ninja -C $BUILD meshtrain meshrun)" >&2
  exit 2
fi
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
LEFT_OUT=$TMP/left_out.txt # lines: CASE CONFIG REASON
touch "$RESULTS" "$LEFT_OUT"
prepare_demo_data
FAILED=0

left_out() { grep -q -e "^$1 $2 " "$LEFT_OUT"; }

# run_case CASE CONFIG ROUND DIR
run_case() {
  local case=$1 cfg=$2 round=$3 d=$4 block batch tps ok=1
  read -r _ _ _ block batch <<< "$(config_shape "$cfg")"
  tps=$((batch * block)) # one replica: every case trains on the same global batch
  # shellcheck disable=SC2046
  case $case in
    tp2 | tp2sp)
      local sp=false
      [[ $case == tp2sp ]] && sp=true
      "$BUILD/meshrun" --nproc-per-node 2 -- "$BUILD/meshtrain" $(train_args "$cfg" "$d/$case") \
        --set dist.backend=shm --set parallel.tp=2 --set parallel.sequence_parallel=$sp \
        > "$d/$case.log" 2>&1 || ok=0
      [[ $ok == 1 ]] && ! grep -q 'meshtrain: GPT.*tensor parallelism over 2 ranks' "$d/$case.log" &&
        ok=0 && echo "tp_bench: the $case run does not say it used tensor parallelism" >&2
      ;;
    one1 | one2)
      "$BUILD/meshtrain" $(train_args "$cfg" "$d/$case") --set train.threads="${case#one}" \
        > "$d/$case.log" 2>&1 || ok=0
      ;;
  esac
  if [[ $ok == 1 ]] && summarize "$case" "$cfg" "$round" "$tps" "$d/$case/metrics.jsonl" \
    > "$d/$case.json" 2> "$d/$case.err"; then
    tee -a "$RESULTS" < "$d/$case.json"
  else
    echo "tp_bench: $case (config $cfg, round $round) failed; left out of config $cfg from" \
      "here on; last lines of its log:" >&2
    tail -n 20 "$d/$case.log" >&2
    cat "$d/$case.err" >&2 2> /dev/null || true
    echo "$case $cfg failed in round $round" >> "$LEFT_OUT"
    FAILED=1
  fi
}

read -r -a CASE_LIST <<< "$CASES"
for cfg in $CONFIGS; do
  for ((round = 1; round <= ROUNDS; ++round)); do
    d=$TMP/$cfg-$round
    mkdir -p "$d"
    n=${#CASE_LIST[@]}
    for ((i = 0; i < n; ++i)); do
      case=${CASE_LIST[$(((i + round - 1) % n))]}
      left_out "$case" "$cfg" && continue
      echo "tp_bench: config $cfg, round $round/$ROUNDS: $case" >&2
      run_case "$case" "$cfg" "$round" "$d"
    done
  done
done

MT_BLAS=$(meshtrain_blas "$TMP"/*/*.log)
"$PY" - "$RESULTS" "$LEFT_OUT" "${MT_BLAS:-?}" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
left_out = [l.rstrip("\n").split(" ", 2) for l in open(sys.argv[2]) if l.strip()]
names = {"tp2": "tp = 2 (2 ranks x 1 thread)", "tp2sp": "tp = 2 + sequence parallel",
         "one1": "1 rank x 1 thread", "one2": "1 rank x 2 threads"}
print()
print(f"meshtrain BLAS: {sys.argv[3]}; PyTorch 1.13 has no tensor parallelism (no peer)")
for case, cfg, why in left_out:
    print(f"Left out: {names[case]} (config {cfg}): {why}")
if not rows:
    sys.exit("tp_bench: no measurements")
print()
hdr = ["config", "case", "tok/s", "vs 1 rank x 1 thread", "rounds"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
configs = list(dict.fromkeys(r["config"] for r in rows))
def med(cfg, case):
    v = [r["tokens_per_s"] for r in rows if r["config"] == cfg and r["case"] == case]
    return statistics.median(v) if v else None
for cfg in configs:
    base = med(cfg, "one1")
    for case in names:
        sel = [r for r in rows if r["config"] == cfg and r["case"] == case]
        if not sel:
            continue
        tps = med(cfg, case)
        print("| " + " | ".join([cfg, names[case], f"{tps:,.0f}",
                                 f"{tps / base:.3f}x" if base else "-", str(len(sel))]) + " |")
print()
hdr = ["config", "ratio", "goal", "ratio of medians", "per round: median (min-max)"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for cfg in configs:
    by = {(r["round"], r["case"]): r["tokens_per_s"] for r in rows if r["config"] == cfg}
    for x, y, goal in [("tp2", "one1", ">= 1.60x"), ("tp2", "one2", "-"),
                       ("tp2sp", "one1", "-")]:
        mx, my = med(cfg, x), med(cfg, y)
        if mx is None or my is None:
            continue
        rs = sorted(by[(k, x)] / by[(k, y)] for k, c in by if c == x and (k, y) in by)
        print("| " + " | ".join([cfg, f"{names[x]} / {names[y]}", goal, f"{mx / my:.3f}x",
                                 f"{statistics.median(rs):.3f}x ({rs[0]:.3f}-{rs[-1]:.3f})"]) +
              " |")
EOF
exit "$FAILED"
