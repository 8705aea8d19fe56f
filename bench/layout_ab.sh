#!/usr/bin/env bash
# Two builds of meshtrain side by side on the demo model, 2 ranks x 1 thread over shm, for each
# parallel layout (DDP, ZeRO-2, ZeRO-3, pp = 2, tp = 2), interleaved run by run: one line per run,
# "round layout side tokens/s" (the median over the steps after the 10th, from metrics.jsonl),
# then a table of the medians and their ratio. For checking that a change to the engine leaves
# every layout's speed where it was.
#
# Usage: bench/layout_ab.sh BEFORE_BUILD AFTER_BUILD DATA_DIR [ROUNDS]
set -euo pipefail
before=$1 after=$2 data=$3 rounds=${4:-4}
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A layout=(
  [ddp]=""
  [zero2]="--set parallel.zero_stage=2"
  [zero3]="--set parallel.zero_stage=3"
  [pp2]="--set parallel.pp=2 --set parallel.micro_batches=8"
  [tp2]="--set parallel.tp=2")
for round in $(seq 1 "$rounds"); do
  for lay in ddp zero2 zero3 pp2 tp2; do
    for side in before after; do
      build=$before
      [[ $side == after ]] && build=$after
      run=$out/$side-$lay-$round
      # shellcheck disable=SC2086
      "$build/meshrun" --nproc-per-node 2 -- "$build/meshtrain" train --config configs/demo.toml \
        --set data.dir="$data" --set train.steps=40 --set train.eval_interval=0 \
        --set train.log_interval=1 --set ckpt.interval=0 --set train.sample_tokens=0 \
        --set train.save_weights=false --set train.threads=1 --set dist.backend=shm \
        --set train.out_dir="$run" ${layout[$lay]} >"$run.log" 2>&1 ||
        { echo "layout_ab: $side $lay failed; see $run.log" >&2; tail -3 "$run.log" >&2; exit 1; }
      python3 - "$run/metrics.jsonl" "$round $lay $side" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 10]
print(sys.argv[2], round(statistics.median(t)))
PY
    done
  done
done | tee "$out/runs.txt"
python3 - "$out/runs.txt" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, lay, side, v = line.split()
    d[(lay, side)].append(int(v))
print("| layout | before tokens/s | after tokens/s | after / before |")
print("|---|---|---|---|")
for lay in ["ddp", "zero2", "zero3", "pp2", "tp2"]:
    b, a = statistics.median(d[(lay, "before")]), statistics.median(d[(lay, "after")])
    print(f"| {lay} | {b:,.0f} | {a:,.0f} | {a / b:.2f} |")
PY
