#!/usr/bin/env bash
# A mixture-of-experts GPT against the dense GPT of the same active parameters, on the demo data.
#
# Usage: bench/moe_compare.sh [BUILD] [--steps N] [--ranks R] [--seeds "1337 2"]
#                             [--moe "--set model.moe.KEY=V ..."] [--runs "dense moe"] [--out DIR]
# Both runs are configs/demo.toml on R ranks (2) under meshrun, 1 thread each, with the same
# seed, data order and schedule; the MoE run replaces every block's MLP by 4 experts of half the
# width, two per token, dropless (top_k x expert_hidden = the dense 4 x n_embd: equal active
# parameters), unless --moe says otherwise. For each seed, one JSON line per run: the final
# validation loss, tokens/s (the last progress line's), and for the MoE run the experts' worst
# max/mean routed load over the steps after the warm-up (median, 90th percentile, the largest,
# and the share of those steps above 1.25); then the difference of the validation losses
# (MoE - dense; negative: MoE better). --runs moe skips the dense run.
set -euo pipefail
BUILD=build
[[ $# -gt 0 && $1 != --* ]] && { BUILD=$1; shift; }
STEPS=600 RANKS=2 SEEDS="1337" RUNS="dense moe" OUT=$(mktemp -d)
MOE="--set model.moe.every=1 --set model.moe.num_experts=4 --set model.moe.top_k=2 \
--set model.moe.expert_hidden=256 --set model.moe.drop_tokens=false"
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --moe) MOE=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "moe_compare.sh: unknown argument $1 (see the header for usage)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
common="--config configs/demo.toml --set train.threads=1 --set ckpt.interval=0 \
--set train.sample_tokens=0 --set train.eval_interval=100 --set train.steps=$STEPS"
summary() {  # run directory, name, seed
  python3 - "$1" "$2" "$3" <<'PY'
import json, statistics, sys
d, name, seed = sys.argv[1:]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
val = [r["val_loss"] for r in rows if "val_loss" in r]
rate = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
out = {"run": name, "seed": int(seed), "val_loss": val[-1], "tokens_per_s": rate[-1]}
loads = [r["moe"]["max_mean_load"] for r in rows if "moe" in r and r["step"] > 100]
if loads:
    loads.sort()
    out["max_mean_load_median"] = statistics.median(loads)
    out["max_mean_load_p90"] = loads[int(0.9 * (len(loads) - 1))]
    out["max_mean_load_max"] = loads[-1]
    out["steps_above_1_25"] = sum(1 for v in loads if v > 1.25) / len(loads)
print(json.dumps(out))
PY
}
for seed in $SEEDS; do
  for run in $RUNS; do
    flags="--set train.seed=$seed"
    [[ $run == moe ]] && flags="$flags $MOE"
    rm -rf "$OUT/$run-$seed"
    # shellcheck disable=SC2086
    "$BUILD/meshrun" --nproc-per-node "$RANKS" -- "$BUILD/meshtrain" train $common $flags \
      --set train.out_dir="$OUT/$run-$seed" >"$OUT/$run-$seed.log" 2>&1 ||
      { echo "moe_compare.sh: the $run run failed, see $OUT/$run-$seed.log" >&2; exit 1; }
    summary "$OUT/$run-$seed" "$run" "$seed" | tee "$OUT/$run-$seed.json"
  done
  [[ -f $OUT/dense-$seed.json && -f $OUT/moe-$seed.json ]] || continue
  python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); \
print(json.dumps({'seed': a['seed'], 'val_loss_moe_minus_dense': b['val_loss'] - a['val_loss']}))" \
    "$OUT/dense-$seed.json" "$OUT/moe-$seed.json"
done
