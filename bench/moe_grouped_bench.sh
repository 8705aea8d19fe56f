#!/usr/bin/env bash
# The experts run as one grouped operation (model.moe.grouped_experts = true: side by side over
# the threads, one expert per thread) against one after another (false: each expert's products
# spread over every thread), on one rank of the demo MoE GPT.
#
# Usage: bench/moe_grouped_bench.sh [BUILD] [--rounds N] [--steps N] [--threads "1 2"]
#                                   [--shapes "4x256 8x128"] [--router-balance batch|none]
# A shape is EXPERTSxHIDDEN (top-2, dropless, every block); --router-balance none routes by the
# probabilities alone (configs/demo_moe.toml balances each batch), so the experts' row counts
# change from step to step. For each shape and thread count the
# two settings alternate round by round; one JSON line each with the median step time over the
# steps after the fifth, per round, their median, and the ratio (ungrouped / grouped: above 1 the
# grouped run is faster).
set -euo pipefail
BUILD=build
[[ $# -gt 0 && $1 != --* ]] && { BUILD=$1; shift; }
ROUNDS=5 STEPS=40 THREADS="1 2" SHAPES="4x256 8x128" BALANCE=batch
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --router-balance) BALANCE=$2; shift 2 ;;
    *) echo "moe_grouped_bench.sh: unknown argument $1 (see the header for usage)" >&2; exit 2 ;;
  esac
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
step_ms() {  # threads experts hidden grouped
  rm -rf "$OUT/run"
  "$BUILD/meshtrain" train --config configs/demo_moe.toml --set train.steps="$STEPS" \
    --set train.threads="$1" --set model.moe.num_experts="$2" --set model.moe.expert_hidden="$3" \
    --set model.moe.grouped_experts="$4" --set model.moe.router_balance="$BALANCE" \
    --set ckpt.interval=0 --set train.eval_interval=0 \
    --set train.sample_tokens=0 --set train.log_interval=1 --set train.out_dir="$OUT/run" \
    >"$OUT/log" 2>&1 || { echo "moe_grouped_bench.sh: a run failed:" >&2; cat "$OUT/log" >&2; exit 1; }
  python3 - "$OUT/run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(round(1000 * statistics.median(r["step_s"] for r in rows if "step_s" in r and r["step"] > 5), 3))
PY
}
total=$(( $(wc -w <<<"$SHAPES") * $(wc -w <<<"$THREADS") * ROUNDS ))
done_runs=0 start=$SECONDS
for shape in $SHAPES; do
  experts=${shape%x*} hidden=${shape#*x}
  for threads in $THREADS; do
    grouped=() plain=()
    for ((r = 0; r < ROUNDS; r++)); do
      grouped+=("$(step_ms "$threads" "$experts" "$hidden" true)")
      plain+=("$(step_ms "$threads" "$experts" "$hidden" false)")
      done_runs=$((done_runs + 1))
      left=$(( (SECONDS - start) * (total - done_runs) / done_runs ))
      echo "moe_grouped_bench: $done_runs/$total rounds, about ${left}s left" >&2
    done
    python3 - "$shape" "$threads" "${grouped[*]}" "${plain[*]}" <<'PY'
import json, statistics, sys
shape, threads, g, p = sys.argv[1:]
g = [float(v) for v in g.split()]
p = [float(v) for v in p.split()]
print(json.dumps({"shape": shape, "threads": int(threads), "grouped_ms": g, "one_by_one_ms": p,
                  "grouped_median_ms": statistics.median(g),
                  "one_by_one_median_ms": statistics.median(p),
                  "ratio": statistics.median(p) / statistics.median(g)}))
PY
  done
done
