#!/usr/bin/env bash
# Expert parallelism against PyTorch: a mixture-of-experts GPT trained on 2 CPU ranks with its
# experts shared out over them, tokens exchanged by all-to-all.
#
# Usage: bench/moe_ep_bench.sh [BUILD] [--rounds R] [--steps N] [--warmup W] [--experts E]
#                              [--top-k K] [--expert-hidden H] [--router-balance none|batch]
# The model is config a of the training benchmarks (4 layers, n_embd 128, 4 heads, block 128,
# batch 8 per rank, vocab 257) with every block's MLP replaced by E experts (4) of H hidden
# features (256: top-2 at half width has the dense model's active parameters), dropless, the
# Switch load-balancing and z losses at meshtrain's default weights; --router-balance batch
# balances each batch's choice on both sides (model.moe.router_balance; the PyTorch script does
# the same search in torch ops). Each round runs, one after
# the other:
#   (e) meshtrain, 2 ranks x 1 thread, parallel.ep = 2 (shm backend);
#   (d) meshtrain, 2 ranks x 1 thread, parallel.ep = 1 (every rank every expert, DDP);
#   (t) PyTorch 1.13, 2 ranks x 1 thread, gloo, experts shared out the same way with
#       all_to_all_single (bench/python/moe_ep_bench_torch.py).
# tokens/s = global tokens per step / median step time after the warm-up. One JSON line per
# measurement, then the medians over rounds and the ratios (per round too).
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ROUNDS=3
STEPS_A=30
STEPS_B=30
WARMUP=3
EXPERTS=4
TOP_K=2
HIDDEN=256
BALANCE=none
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS_A=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --experts) EXPERTS=$2; shift 2 ;;
    --top-k) TOP_K=$2; shift 2 ;;
    --expert-hidden) HIDDEN=$2; shift 2 ;;
    --router-balance) BALANCE=$2; shift 2 ;;
    *) echo "moe_ep_bench: unknown argument $1 (see the header for usage)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=moe_ep_bench
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
prepare_demo_data

fail() {
  echo "moe_ep_bench: $1 failed; last lines of its log:" >&2
  tail -n 20 "$2" >&2
  exit 1
}

MOE=(--set model.moe.every=1 --set model.moe.num_experts="$EXPERTS" --set model.moe.top_k="$TOP_K"
  --set model.moe.expert_hidden="$HIDDEN" --set model.moe.drop_tokens=false
  --set model.moe.router_balance="$BALANCE" --set dist.backend=shm)
read -r layers embd heads block batch <<< "$(config_shape a)"
tps=$((2 * batch * block))
for ((round = 1; round <= ROUNDS; ++round)); do
  d=$TMP/$round
  mkdir -p "$d"
  for ep in 2 1; do
    c=$([[ $ep == 2 ]] && echo e || echo d)
    # shellcheck disable=SC2046
    "$BUILD/meshrun" --nproc-per-node 2 -- "$BUILD/meshtrain" $(train_args a "$d/$c") "${MOE[@]}" \
      --set parallel.ep=$ep > "$d/$c.log" 2>&1 || fail "($c)" "$d/$c.log"
    summarize --comm "$c" a "$round" "$tps" "$d/$c/metrics.jsonl" | tee -a "$RESULTS"
  done
  "$PY" bench/python/moe_ep_bench_torch.py --world-size 2 --threads 1 --n-layer "$layers" \
    --n-embd "$embd" --n-head "$heads" --block-size "$block" --batch-size "$batch" \
    --vocab-size 257 --experts "$EXPERTS" --top-k "$TOP_K" --expert-hidden "$HIDDEN" \
    --router-balance "$BALANCE" --steps "$STEPS_A" --warmup "$WARMUP" > "$d/t.out" \
    2> "$d/t.log" || fail "(t)" "$d/t.log"
  torch_row t a "$round" "$d/t.out" | tee -a "$RESULTS"
done

echo "meshtrain BLAS: $(meshtrain_blas "$TMP"/*/*.log)"
"$PY" - "$RESULTS" << 'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [r for r in rows if r["case"] == "t"]
print()
print("Goal: (e) >= 1.5x (t).")
if t:
    print(f"PyTorch {t[0]['torch_version']}, BLAS {t[0]['blas']}")
med = {c: statistics.median(r["tokens_per_s"] for r in rows if r["case"] == c) for c in "edt"}
by = {(r["round"], r["case"]): r["tokens_per_s"] for r in rows}
def per_round(x, y):
    rs = sorted(by[(k, x)] / by[(k, y)] for k, c in by if c == x and (k, y) in by)
    return f"{statistics.median(rs):.2f} ({rs[0]:.2f}-{rs[-1]:.2f})"
print("| (e) ep=2 tok/s | (d) ep=1 tok/s | (t) PyTorch ep=2 tok/s | (e)/(t) | (e)/(t) per round "
      "| (e)/(d) per round |")
print("|---|---|---|---|---|---|")
print(f"| {med['e']:.0f} | {med['d']:.0f} | {med['t']:.0f} | {med['e'] / med['t']:.2f}x "
      f"| {per_round('e', 't')} | {per_round('e', 'd')} |")
PYEOF
