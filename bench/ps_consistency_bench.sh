#!/usr/bin/env bash
# Parameter-server consistency modes against sync with one worker slowed: how soon each reaches
# the validation loss sync ends with, and where each ends after the same number of steps per
# worker (the same samples).
#
# Usage: bench/ps_consistency_bench.sh [BUILD] [--steps N] [--eval E] [--slowdown F]
#                                      [--stalls SPEC] [--modes "sync ssp async"] [--staleness S]
#                                      [--rounds R] [--out DIR]
# Each run is configs/demo.toml (2 layers) with 2 workers and 1 server under meshrun, 1 thread
# each, worker 1 taking F times as long per step (MESHTRAIN_TEST_SLOWDOWN=F@1: it waits (F - 1)
# x its step's time after each step, as a node that is F times slower). --stalls SPEC replaces
# that with MESHTRAIN_TEST_SLOWDOWN=SPEC, e.g. "5~0.25": every worker stalls 5x on a quarter of
# its steps, drawn independently (as slow on average as a worker slowed 2x, but in passing: what
# bounded staleness absorbs and a synchronous step, waiting for the slower of the two, does not).
# Rank 0 (worker 0) evaluates every E steps. Modes run interleaved, R rounds. One JSON line per
# run: wall seconds of the job, rank 0's time (the sum of its step times) when its validation
# loss first reached the target (sync's final validation loss of the same round), and its final
# validation loss; then a summary line per mode with the medians and the ratios to sync.
set -euo pipefail
BUILD=build
[[ $# -gt 0 && $1 != --* ]] && { BUILD=$1; shift; }
STEPS=60 EVAL=5 SLOW=2 STALLS="" MODES="sync ssp async" STALENESS=3 ROUNDS=2 OUT=$(mktemp -d)
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --eval) EVAL=$2; shift 2 ;;
    --slowdown) SLOW=$2; shift 2 ;;
    --stalls) STALLS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --staleness) STALENESS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "ps_consistency_bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $MODES == sync* ]] || { echo "ps_consistency_bench.sh: --modes must start with sync (the target)" >&2; exit 2; }
mkdir -p "$OUT"
child=""
trap '[[ -n $child ]] && kill -- -"$child" 2>/dev/null; wait 2>/dev/null || true' EXIT INT TERM
common="--config configs/demo.toml --set model.n_layer=2 --set train.threads=1 \
--set ckpt.interval=0 --set train.sample_tokens=0 --set train.eval_interval=$EVAL \
--set train.steps=$STEPS --set parallel.ps.staleness=$STALENESS"
for round in $(seq 1 "$ROUNDS"); do
  target=""
  for mode in $MODES; do
    dir="$OUT/$mode-$round"
    rm -rf "$dir"
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    setsid env MESHTRAIN_TEST_SLOWDOWN="${STALLS:-$SLOW@1}" "$BUILD/meshrun" --nproc-per-node 3 \
      --ps-servers 1 -- "$BUILD/meshtrain" train $common \
      --set parallel.ps.consistency="$mode" --set train.out_dir="$dir" >"$dir.log" 2>&1 &
    child=$!
    wait "$child" || { echo "ps_consistency_bench.sh: the $mode run failed, see $dir.log" >&2; exit 1; }
    child=""
    wall=$(python3 -c "import sys,time; print(time.time() - float(sys.argv[1]))" "$start")
    line=$(python3 - "$dir" "$mode" "$round" "$wall" "${target:-nan}" <<'PY'
import json, math, sys
d, mode, rnd, wall, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
t, reach, final = 0.0, None, None
for l in open(d + "/metrics.jsonl"):
    r = json.loads(l)
    t += r.get("step_s", 0.0)
    if "val_loss" in r:
        final = r["val_loss"]
        if reach is None and not math.isnan(target) and r["val_loss"] <= target:
            reach = t
if math.isnan(target):
    reach = t  # sync: the target is where it ends
server = json.load(open(d + "/ps_server0.json"))
print(json.dumps({"mode": mode, "round": rnd, "wall_s": round(wall, 2),
                  "time_to_target_s": reach if reach is None else round(reach, 2),
                  "target": None if math.isnan(target) else target, "final_val_loss": final,
                  "max_staleness": server["max_staleness"], "server_load": round(server["load"], 3)}))
PY
)
    echo "$line" | tee -a "$OUT/runs.jsonl"
    [[ $mode == sync ]] && target=$(echo "$line" | python3 -c "import json,sys; print(json.load(sys.stdin)['final_val_loss'])")
  done
done
python3 - "$OUT/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(mode, key):
    v = [r[key] for r in runs if r["mode"] == mode and r[key] is not None]
    return statistics.median(v) if v else None
sync_wall, sync_reach = med("sync", "wall_s"), med("sync", "time_to_target_s")
sync_final = med("sync", "final_val_loss")
for mode in dict.fromkeys(r["mode"] for r in runs):
    reach = med(mode, "time_to_target_s")
    print(json.dumps({"summary": mode, "wall_s": med(mode, "wall_s"),
                      "wall_vs_sync": round(med(mode, "wall_s") / sync_wall, 3),
                      "time_to_target_s": reach,
                      "time_to_target_vs_sync": None if reach is None else round(reach / sync_reach, 3),
                      "final_val_loss": med(mode, "final_val_loss"),
                      "final_minus_sync": round(med(mode, "final_val_loss") - sync_final, 4)}))
PY
