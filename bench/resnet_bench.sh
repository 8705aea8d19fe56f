#!/usr/bin/env bash
# ResNet training on the CPU: meshtrain against PyTorch on the same model, data and optimizer.
#
# Usage: bench/resnet_bench.sh [BUILD] [--model small|tiny|resnet18|resnet50] [--rounds R]
#                              [--steps N] [--warmup W] [--batch-size B] [--lr LR]
#                              [--weight-decay WD] [--cases "m1 m2 t1 t2"] [--sync-bn 0|1]
#                              [--data-dir DIR] [--blas-core NAME|native]
#                              [--to-accuracy A [--max-epochs E]]
#                              [--schedule constant|cosine] [--warmup-steps N] [--nesterov 0|1]
# The model is one of meshtrain's ResNets (`small` by default: the 28x28 stem, basic blocks
# [2, 2, 2] at widths 16, 32, 64), in PyTorch tests/python/resnet_torch.py with torchvision's
# names and structure. Data: Fashion-MNIST (DIR, by default Debian's dataset-fashion-mnist), with
# meshtrain's normalisation and augmentation on both sides (random crop with padding 4 and
# horizontal flip). Optimizer: SGD with momentum 0.9 (--nesterov 1: Nesterov's), a constant
# learning rate (--schedule cosine: linear warm-up over --warmup-steps, then cosine decay to zero
# at the end of --max-epochs, meshtrain's schedule, which the PyTorch side computes the same way),
# weight decay on the convolution and fc weights, no gradient clipping. B images per rank per step.
# Each round runs these cases, one after the other, the order rotating by one case per round:
#   m1  meshtrain, 1 rank x 1 thread;
#   m2  meshtrain, 2 ranks x 1 thread under meshrun --nproc-per-node 2 (dist.backend shm), with
#       SyncBatchNorm over both ranks (--sync-bn 0: each rank's batch alone);
#   t1  PyTorch, 1 rank x 1 thread (bench/python/resnet_bench_torch.py);
#   t2  PyTorch DDP, 2 ranks x 1 thread over gloo, plain BatchNorm2d per rank: PyTorch's
#       SyncBatchNorm runs only on CUDA devices, so PyTorch does less work per step than m2.
# Images/s = images per step (over all ranks) / rank 0's median step time after the W warm-up
# steps (meshtrain: step_s in metrics.jsonl; PyTorch: the step's wall time, its batch's
# augmentation included, as meshtrain's step includes taking a batch). One JSON line per
# measurement, then a table of the medians over rounds with the ratios, as ratio of medians and
# as median (min-max) of the per-round ratios. Goal: meshtrain images/s >= 1.3x PyTorch's (m2/t2
# and m1/t1). --blas-core sets OPENBLAS_CORETYPE for every case as in bench/ddp_bench.sh; the
# footer says which BLAS each side ran.
#
# --to-accuracy A (long: minutes to hours, not for CI): instead of the throughput rounds, m2 and
# t2 (or the cases given) each train for E epochs (default 30), evaluating the test split after
# every epoch, and report when the test accuracy first reached A: the epoch, the summed step
# times up to it and the wall time from the launch to that evaluation (start-up and evaluations
# included). PyTorch stops there; meshtrain (one run whose schedule spans the E epochs, evaluating
# every epoch's worth of steps on the test split's first 10000 / B batches of B images, all but
# the last 10000 mod B images) trains on to the end, which is not counted. Then the ratio of the
# wall times to A (goal: meshtrain >= 1.3x faster).
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
MODEL=small
ROUNDS=3
STEPS=30
WARMUP=3
BATCH=64
LR=0.05
WD=5e-4
CASES=""
SYNC_BN=1
DATA_DIR=/usr/share/datasets/fashion-mnist
BLAS_CORE=""
TO_ACC=""
MAX_EPOCHS=30
SCHEDULE=constant
WARMUP_STEPS=0
NESTEROV=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --lr) LR=$2; shift 2 ;;
    --weight-decay) WD=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --sync-bn) SYNC_BN=$2; shift 2 ;;
    --data-dir) DATA_DIR=$2; shift 2 ;;
    --blas-core) BLAS_CORE=$2; shift 2 ;;
    --to-accuracy) TO_ACC=$2; shift 2 ;;
    --max-epochs) MAX_EPOCHS=$2; shift 2 ;;
    --schedule) SCHEDULE=$2; shift 2 ;;
    --warmup-steps) WARMUP_STEPS=$2; shift 2 ;;
    --nesterov) NESTEROV=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "resnet_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=resnet_bench
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
if [[ -z $CASES ]]; then
  [[ -n $TO_ACC ]] && CASES="m2 t2" || CASES="m1 m2 t1 t2"
fi
check_cases "m1 m2 t1 t2" "$CASES"
if [[ $SCHEDULE != constant && $SCHEDULE != cosine ]]; then
  echo "resnet_bench: --schedule $SCHEDULE is not constant or cosine" >&2
  exit 2
fi
if [[ $SCHEDULE == cosine && -z $TO_ACC ]]; then
  echo "resnet_bench: --schedule cosine decays over --max-epochs, so it needs --to-accuracy" >&2
  exit 2
fi
NESTEROV_BOOL=false
[[ $NESTEROV == 1 ]] && NESTEROV_BOOL=true
apply_blas_core "$BLAS_CORE"
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
if [[ ! -e $DATA_DIR/train-images-idx3-ubyte.gz && ! -e $DATA_DIR/train-images-idx3-ubyte ]]; then
  echo "resnet_bench: no Fashion-MNIST in $DATA_DIR; run scripts/install-deps.sh" \
    "(package dataset-fashion-mnist)" >&2
  exit 2
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
SYNC=false
[[ $SYNC_BN == 1 ]] && SYNC=true

fail() {
  echo "resnet_bench: $1 failed; last lines of its log:" >&2
  tail -n 20 "$2" >&2
  exit 1
}

# meshtrain train arguments: directory, steps, ranks, then extra --set pairs.
mt_args() {
  local out=$1 steps=$2 ranks=$3
  shift 3
  local sync=false
  [[ $ranks -gt 1 ]] && sync=$SYNC
  echo train --set model.kind=resnet --set model.resnet="$MODEL" \
    --set model.sync_batch_norm="$sync" --set data.kind=fashion_mnist \
    --set data.image_dir="$DATA_DIR" --set data.batch_size="$BATCH" \
    --set optim.name=sgd --set optim.lr="$LR" --set optim.momentum=0.9 \
    --set optim.nesterov="$NESTEROV_BOOL" --set optim.weight_decay="$WD" \
    --set optim.schedule="$SCHEDULE" --set optim.warmup_steps="$WARMUP_STEPS" \
    --set optim.min_lr_ratio=0 \
    --set optim.grad_clip=0 --set train.threads=1 --set train.steps="$steps" \
    --set train.log_interval=1 --set train.eval_interval=0 --set data.val_batches=1 \
    --set train.save_weights=false --set train.out_dir="$out" "$@"
}

# Runs meshtrain case m1 or m2 into directory $2 with the arguments that follow.
run_meshtrain() {
  local c=$1 d=$2
  shift 2
  if [[ $c == m1 ]]; then
    "$BUILD/meshtrain" "$@" > "$d.log" 2>&1 || fail "$c" "$d.log"
  else
    "$BUILD/meshrun" --nproc-per-node 2 -- "$BUILD/meshtrain" "$@" --set dist.backend=shm \
      > "$d.log" 2>&1 || fail "$c" "$d.log"
  fi
}

ranks_of() { [[ $1 == ?2 ]] && echo 2 || echo 1; }

# One JSON line of a meshtrain throughput run: CASE ROUND METRICS.
mt_row() {
  "$PY" - "$WARMUP" "$MODEL" "$BATCH" "$@" << 'EOF'
import json, statistics, sys
warmup, model, batch = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
case, rnd, path = sys.argv[4:7]
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "event" not in r and "step_s" in r and r.get("step", 0) > warmup]
if not rows:
    sys.exit(f"resnet_bench: no timed steps in {path}")
steps = [r["step_s"] for r in rows]
ranks = 2 if case.endswith("2") else 1
median = statistics.median(steps)
print(json.dumps({"case": case, "round": int(rnd), "impl": "meshtrain", "model": model,
                  "world_size": ranks, "batch_size": batch, "images_per_step": batch * ranks,
                  "steps": len(steps), "step_ms_median": median * 1e3,
                  "step_ms_min": min(steps) * 1e3, "step_ms_max": max(steps) * 1e3,
                  "images_per_s": batch * ranks / median,
                  "final_loss": rows[-1].get("loss")}))
EOF
}

# The JSON line the PyTorch peer printed last, tagged with case and round: CASE ROUND OUT.
torch_line() {
  "$PY" -c 'import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
r.update(case=sys.argv[2], round=int(sys.argv[3]))
print(json.dumps(r))' "$3" "$1" "$2"
}

run_torch() {
  local c=$1 d=$2
  shift 2
  "$PY" bench/python/resnet_bench_torch.py --model "$MODEL" --world-size "$(ranks_of "$c")" \
    --threads 1 --batch-size "$BATCH" --lr "$LR" --momentum 0.9 --weight-decay "$WD" \
    --nesterov "$NESTEROV" --schedule "$SCHEDULE" --warmup-steps "$WARMUP_STEPS" \
    --data-dir "$DATA_DIR" "$@" > "$d.out" 2> "$d.log" || fail "$c" "$d.log"
}

if [[ -n $TO_ACC ]]; then
  # Time to accuracy: one pass per case, epoch by epoch.
  TRAIN_IMAGES=$("$PY" -c 'import gzip, os, sys
d = sys.argv[1]; p = os.path.join(d, "train-labels-idx1-ubyte")
f = gzip.open(p + ".gz") if os.path.exists(p + ".gz") else open(p, "rb")
print(int.from_bytes(f.read(8)[4:8], "big"))' "$DATA_DIR")
  for c in $CASES; do
    d=$TMP/$c
    ranks=$(ranks_of "$c")
    if [[ $c == t* ]]; then
      run_torch "$c" "$d" --to-accuracy "$TO_ACC" --max-epochs "$MAX_EPOCHS"
      torch_line "$c" 1 "$d.out" | tee -a "$RESULTS"
      continue
    fi
    per_epoch=$((TRAIN_IMAGES / ranks / BATCH))
    start=$(date +%s.%N)
    # shellcheck disable=SC2046
    run_meshtrain "$c" "$d" $(mt_args "$d" $((MAX_EPOCHS * per_epoch)) "$ranks" \
      --set train.eval_interval="$per_epoch" --set data.val_batches=$((10000 / BATCH)) \
      --set train.log_interval="$per_epoch" --set ckpt.interval=0 --set ckpt.resume=false)
    "$PY" - "$c" "$MODEL" "$BATCH" "$ranks" "$TO_ACC" "$per_epoch" "$start" "$d.log" \
      "$d/metrics.jsonl" << 'EOF' | tee -a "$RESULTS"
import datetime, json, re, sys
case, model, batch, ranks, target, per_epoch, start, log, path = sys.argv[1:10]
target, per_epoch, start = float(target), int(per_epoch), float(start)
rows = [json.loads(l) for l in open(path) if l.strip()]
steps = {r["step"]: r["step_s"] for r in rows if "event" not in r and "step_s" in r}
evals = {r["step"]: r["val_accuracy"] for r in rows
         if "val_accuracy" in r and r["step"] > 0 and r["step"] % per_epoch == 0}
# When each evaluation was printed: the progress line of its step carries the time.
when = {}
for line in open(log):
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+) rank 0 step (\d+) .*val_accuracy", line)
    if m:
        when[int(m.group(2))] = datetime.datetime.fromisoformat(m.group(1)).timestamp()
accs = [evals[k] for k in sorted(evals)]
hit = next((k for k in sorted(evals) if evals[k] >= target), None)
out = {"case": case, "round": 1, "impl": "meshtrain", "mode": "to_accuracy", "model": model,
       "world_size": int(ranks), "batch_size": int(batch), "target": target,
       "reached": hit is not None, "accuracy": accs, "steps_per_epoch": per_epoch,
       "eval_images": 10000 // int(batch) * int(batch)}
out["epochs"] = hit // per_epoch if hit is not None else len(accs)
out["train_s"] = sum(v for k, v in steps.items() if hit is None or k <= hit)
out["wall_s"] = when.get(hit) - start if hit in when else None
print(json.dumps(out))
EOF
  done
else
  read -r -a ORDER <<< "$CASES"
  for ((round = 1; round <= ROUNDS; ++round)); do
    n=${#ORDER[@]}
    for ((k = 0; k < n; ++k)); do
      c=${ORDER[$(((k + round - 1) % n))]}
      d=$TMP/$c-$round
      if [[ $c == m* ]]; then
        # shellcheck disable=SC2046
        run_meshtrain "$c" "$d" $(mt_args "$d" $((WARMUP + STEPS)) "$(ranks_of "$c")" \
          --set ckpt.interval=0 --set ckpt.resume=false)
        mt_row "$c" "$round" "$d/metrics.jsonl" | tee -a "$RESULTS"
      else
        run_torch "$c" "$d" --steps "$STEPS" --warmup "$WARMUP"
        torch_line "$c" "$round" "$d.out" | tee -a "$RESULTS"
      fi
    done
  done
fi

MT_BLAS=$(meshtrain_blas "$TMP"/*.log)
"$PY" - "$RESULTS" "${MT_BLAS:-?}" "$SYNC" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mt_blas, sync = sys.argv[2], sys.argv[3] == "true"
print()
torch_rows = [r for r in rows if r["impl"].startswith("pytorch")]
print(f"meshtrain BLAS: {mt_blas}")
if torch_rows:
    print(f"PyTorch {torch_rows[0]['torch_version']}, BLAS {torch_rows[0]['blas']}")
print("Batch norm over 2 ranks: meshtrain " + ("SyncBatchNorm (both ranks' batches)" if sync
      else "per rank") + "; PyTorch DDP plain BatchNorm2d per rank (its SyncBatchNorm does not "
      "run on the CPU).")
if rows and rows[0].get("mode") == "to_accuracy":
    target = rows[0]["target"]
    print(f"Time to {target:.2%} test accuracy (epochs, summed step times and wall time up to the "
          "first evaluation that reached it; accuracy after every epoch):")
    print("| case | reached | epochs | accuracy per epoch | train s | wall s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        accs = " ".join(f"{a:.4f}" for a in r["accuracy"])
        wall = "-" if r.get("wall_s") is None else f"{r['wall_s']:.1f}"
        print(f"| {r['case']} | {r['reached']} | {r['epochs']} | {accs} | {r['train_s']:.1f} | "
              f"{wall} |")
    by = {r["case"]: r for r in rows}
    for a, b in (("m2", "t2"), ("m1", "t1")):
        if a in by and b in by and by[a].get("reached") and by[b].get("reached"):
            print(f"{b} wall / {a} wall: {by[b]['wall_s'] / by[a]['wall_s']:.2f}x "
                  f"(train s: {by[b]['train_s'] / by[a]['train_s']:.2f}x); goal >= 1.3x")
    sys.exit(0)
print("Goal: meshtrain images/s >= 1.3x PyTorch's (m2/t2 and m1/t1).")
print(f"Medians over rounds (rounds: {max(r['round'] for r in rows)}), images/s over all ranks.")
med = {}
for case in ("m1", "m2", "t1", "t2"):
    vals = [r["images_per_s"] for r in rows if r["case"] == case]
    med[case] = statistics.median(vals) if vals else None
print("| case | images/s | step ms |")
print("|---|---|---|")
for case in ("m1", "m2", "t1", "t2"):
    steps = [r["step_ms_median"] for r in rows if r["case"] == case]
    if steps:
        print(f"| {case} | {med[case]:.0f} | {statistics.median(steps):.1f} |")
print()
print("| ratio | of medians | per round | goal |")
print("|---|---|---|---|")
for a, b, goal in (("m2", "t2", "1.3x"), ("m1", "t1", "1.3x"), ("m2", "m1", "-"),
                   ("t2", "t1", "-")):
    if not (med[a] and med[b]):
        continue
    by = {(r["round"], r["case"]): r["images_per_s"] for r in rows}
    per = sorted(by[(k, a)] / by[(k, b)] for k, c in by if c == a and (k, b) in by)
    print(f"| {a}/{b} | {med[a] / med[b]:.2f}x | {statistics.median(per):.2f}x "
          f"({per[0]:.2f}-{per[-1]:.2f}) | {goal} |")
EOF
