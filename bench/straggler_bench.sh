#!/usr/bin/env bash
# Straggler mitigation benchmark: the same elastic job (meshrun --nnodes MIN:MAX, one agent per
# "node" on this host, one rank each, train.threads=1) with one node's compute slowed 3x
# (MESHTRAIN_TEST_SLOWDOWN=3), run with elastic.drop_stragglers = true (the slow node is named,
# every rank checkpoints, the others go on without it) and = false (named only, the job keeps
# its pace), interleaved for a few rounds. Both name the straggler with the same settings; only
# the drop differs. The global batch is the same throughout (dist.elastic_batch = keep): after
# the drop the remaining ranks take it on through gradient accumulation.
#
# Usage: bench/straggler_bench.sh [BUILD] [--rounds R] [--steps N] [--nodes N] [--slowdown F]
#                                 [--detect-steps K]
# One line per run, then the medians and their ratio:
#   straggler_bench mode=drop round=1 wall_s=16.10 last_step=150 named_at=11 factor=3.05 left_out=true
#   straggler_bench summary nodes=2 steps=150 slowdown=3 median_drop_s=16.59 median_keep_s=31.39
#   ratio_keep_over_drop=1.89
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ROUNDS=3
STEPS=150
NODES=2
SLOWDOWN=3
DETECT=10
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --slowdown) SLOWDOWN=$2; shift 2 ;;
    --detect-steps) DETECT=$2; shift 2 ;;
    *) echo "straggler_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
MESHTRAIN=$PWD/$BUILD/meshtrain
MESHRUN=$PWD/$BUILD/meshrun
for bin in "$MESHTRAIN" "$MESHRUN"; do
  [[ -x $bin ]] || { echo "straggler_bench: $bin is missing; build meshtrain and meshrun" >&2; exit 2; }
done
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# A small text corpus, tokenized once.
for i in $(seq 0 19999); do echo "line $((i % 89)) of the text, word $(((i * 7) % 31))."; done >"$WORK/text.txt"
"$MESHTRAIN" data prepare --input "$WORK/text.txt" --out "$WORK/data" --val-fraction 0.1 >/dev/null

# Accumulation NODES-1 on NODES ranks keeps a global batch that NODES-1 ranks can still make
# (with accumulation NODES).
ACCUM=$((NODES - 1))
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

run_once() {  # MODE ROUND -> one line
  local mode=$1 round=$2 drop out endpoint port start end
  drop=$([[ $mode == drop ]] && echo true || echo false)
  out=$WORK/run_${mode}_$round
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  endpoint=127.0.0.1:$port
  PIDS=()
  start=$(date +%s.%N)
  for node in $(seq 0 $((NODES - 1))); do
    local slow=()
    [[ $node == $((NODES - 1)) ]] && slow=(MESHTRAIN_TEST_SLOWDOWN=$SLOWDOWN)
    env MESHTRAIN_TOKEN=straggler-bench "${slow[@]}" "$MESHRUN" --nnodes "$((NODES - 1)):$NODES" \
      --node-rank "$node" --rdzv-endpoint "$endpoint" --rdzv-last-call 60 --rdzv-timeout 120 \
      --grace-period 5 --nproc-per-node 1 -- "$MESHTRAIN" train --config configs/demo.toml \
      --set data.dir="$WORK/data" --set train.out_dir="$out" --set train.threads=1 \
      --set model.n_layer=2 --set data.batch_size=4 --set train.grad_accum_steps=$ACCUM \
      --set train.steps="$STEPS" --set train.eval_interval=0 --set train.log_interval=50 \
      --set train.sample_tokens=0 --set data.val_batches=2 --set ckpt.interval=1000 \
      --set elastic.straggler_factor=2 --set elastic.straggler_steps="$DETECT" \
      --set elastic.drop_stragglers=$drop >"$out.node$node.log" 2>&1 &
    PIDS+=($!)
  done
  local failed=0
  for pid in "${PIDS[@]}"; do wait "$pid" || failed=1; done
  PIDS=()
  end=$(date +%s.%N)
  if [[ $failed != 0 ]]; then
    echo "straggler_bench: the $mode run of round $round failed; its logs:" >&2
    tail -n 20 "$out".node*.log >&2
    exit 1
  fi
  # The last step trained, and the step the straggler was named at, its factor and whether it
  # was left out, from rank 0's metrics.jsonl.
  local facts
  facts=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = max(r["step"] for r in rows if "loss" in r)
named = [r for r in rows if "straggler" in r]
if named:
    s = named[0]["straggler"]
    print("last_step=%d named_at=%d factor=%.2f left_out=%s" % (last, named[0]["step"], s["factor"], str(s["left_out"]).lower()))
else:
    print("last_step=%d named_at=none" % last)' "$out/metrics.jsonl")
  printf 'straggler_bench mode=%s round=%d wall_s=%.2f %s\n' \
    "$mode" "$round" "$(echo "$end - $start" | bc)" "$facts"
}

: >"$WORK/walls"
for round in $(seq 1 "$ROUNDS"); do
  # Interleaved, the order alternating, so that a slow spell of the host hits both modes.
  if ((round % 2)); then modes="drop keep"; else modes="keep drop"; fi
  for mode in $modes; do run_once "$mode" "$round" | tee -a "$WORK/walls"; done
done
drop_s=$(grep 'mode=drop' "$WORK/walls" | sed 's/.*wall_s=\([0-9.]*\).*/\1/' | median)
keep_s=$(grep 'mode=keep' "$WORK/walls" | sed 's/.*wall_s=\([0-9.]*\).*/\1/' | median)
printf 'straggler_bench summary nodes=%d steps=%d slowdown=%s median_drop_s=%.2f median_keep_s=%.2f ratio_keep_over_drop=%.2f\n' \
  "$NODES" "$STEPS" "$SLOWDOWN" "$drop_s" "$keep_s" "$(echo "$keep_s / $drop_s" | bc -l)"
