#!/usr/bin/env bash
# Single-process GPT training over a sweep of shapes: `meshtrain train` against the same model
# in PyTorch (bench/python/train_bench_torch.py), side by side, at 1 and 2 threads.
#
# Usage: bench/train_sweep.sh [BUILD] [--rounds R] [--steps N] [--warmup W] [--threads "1 2"]
#                             [--shapes "s01 s02 ..."] [--blas-core NAME|native]
#                             [--gemm openblas|onednn]
# Each shape is n_layer, n_embd, n_head, block_size (context) and batch size; the 24 shapes
# cover overhead-bound (o: small width, short context), attention-bound (a: long context for
# the width) and GEMM-bound (g: wide) cases. For every round, shape and thread count meshtrain
# runs and then PyTorch (the order alternates between rounds), on the same machine state. Both
# sides train the same GPT with AdamW, global gradient clipping and weight decay on matrices:
# meshtrain on the demo data, PyTorch on random tokens (the step's work does not depend on the
# tokens). tokens/s = tokens per step / median step time after W warm-up steps.
# meshtrain runs with train.kernel_times = true: its rows say how much of each step ran in GEMMs,
# attention, element-wise and optimizer kernels, and how much outside any kernel (allocation,
# copies, autograd, dispatch); the table gives those as percentages of the step.
# Output: one JSON line per measurement, then a table per thread count and a summary line each
# (min and median of the ratios over the shapes).
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ROUNDS=1
STEPS=20
WARMUP=4
THREADS="1 2"
SHAPES=""
BLAS_CORE=""
GEMM=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --blas-core) BLAS_CORE=$2; shift 2 ;;
    --gemm) GEMM=$2; shift 2 ;;
    *) echo "train_sweep: unknown argument $1 (see the header for usage)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=train_sweep
STEPS_A=$STEPS
STEPS_B=$STEPS
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
apply_blas_core "$BLAS_CORE"
prepare_demo_data

# name: kind n_layer n_embd n_head block_size batch_size
declare -A SHAPE=(
  [s01]="o 2 64 2 32 1" [s02]="o 2 64 2 32 8" [s03]="o 2 64 4 64 4" [s04]="o 4 96 2 32 16"
  [s05]="o 4 128 4 32 2" [s06]="o 6 64 4 64 1" [s07]="o 12 64 2 32 4" [s08]="o 2 128 8 64 1"
  [s09]="a 2 64 4 512 2" [s10]="a 2 128 8 512 1" [s11]="a 4 128 4 256 4" [s12]="a 4 64 2 256 8"
  [s13]="a 2 96 12 512 1" [s14]="a 6 192 6 256 2" [s15]="a 4 256 4 512 1" [s16]="a 2 128 2 256 16"
  [s17]="g 2 768 12 64 4" [s18]="g 4 512 8 128 2" [s19]="g 2 384 6 128 8" [s20]="g 6 384 6 64 4"
  [s21]="g 4 256 4 128 16" [s22]="g 12 256 8 64 4" [s23]="g 2 768 12 128 2" [s24]="g 8 512 8 32 8"
)
ALL=$(printf '%s\n' "${!SHAPE[@]}" | sort | tr '\n' ' ')
[[ -z $SHAPES ]] && SHAPES=$ALL
check_cases "$ALL" "$SHAPES"

fail() {
  echo "train_sweep: $1 failed; last lines of its log:" >&2
  tail -n 20 "$2" >&2
  exit 1
}

run_meshtrain() {  # shape threads round dir
  local kind layers embd heads block batch
  read -r kind layers embd heads block batch <<< "${SHAPE[$1]}"
  "$BUILD/meshtrain" train --config configs/demo.toml \
    --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads" \
    --set model.block_size="$block" --set model.vocab_size=257 --set data.batch_size="$batch" \
    --set data.dir="$DATA" --set data.val_batches=1 --set train.threads="$2" \
    --set train.steps="$STEPS" --set train.eval_interval=0 --set train.log_interval=1000 \
    --set train.sample_tokens=0 --set train.save_weights=false --set train.out_dir="$4/m" \
    --set train.kernel_times=true --set ckpt.interval=0 --set ckpt.resume=false \
    ${GEMM:+--set train.gemm=$GEMM} \
    > "$4/m.log" 2>&1 || fail "meshtrain $1 threads $2" "$4/m.log"
  "$PY" - "$WARMUP" "$1" "$kind" "$2" "$3" "$((block * batch))" "$4/m/metrics.jsonl" << 'EOF'
import json, statistics, sys
warmup, shape, kind, threads, rnd, tps, path = sys.argv[1:8]
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "event" not in r and "step_s" in r and r.get("step", 0) > int(warmup)]
if not rows:
    sys.exit(f"train_sweep: no timed steps in {path}")
med = lambda xs: statistics.median(xs)
step = med([r["step_s"] for r in rows])
kernels = {k: med([r["kernel_s"][k] for r in rows]) for k in rows[0]["kernel_s"]}
print(json.dumps({"impl": "meshtrain", "shape": shape, "kind": kind, "threads": int(threads),
                  "round": int(rnd), "steps": len(rows), "step_ms_median": step * 1e3,
                  "tokens_per_s": int(tps) / step,
                  "kernel_ms": {k: v * 1e3 for k, v in kernels.items()},
                  "outside_kernels_ms": med([r["outside_kernels_s"] for r in rows]) * 1e3,
                  "data_comm_ms": med([r["data_s"] + r["comm_s"] for r in rows]) * 1e3}))
EOF
}

run_torch() {  # shape threads round dir
  local kind layers embd heads block batch
  read -r kind layers embd heads block batch <<< "${SHAPE[$1]}"
  "$PY" bench/python/train_bench_torch.py --n-layer "$layers" --n-embd "$embd" \
    --n-head "$heads" --block-size "$block" --batch-size "$batch" --vocab-size 257 \
    --steps "$STEPS" --warmup "$WARMUP" --threads "$2" > "$4/t.out" 2> "$4/t.log" ||
    fail "PyTorch $1 threads $2" "$4/t.log"
  "$PY" -c 'import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
r["model"] = r.pop("config")
r.update(shape=sys.argv[2], kind=sys.argv[3], round=int(sys.argv[4]))
print(json.dumps(r))' "$4/t.out" "$1" "$kind" "$3"
}

total=$((ROUNDS * $(wc -w <<< "$SHAPES") * $(wc -w <<< "$THREADS")))
done_runs=0
start=$(date +%s)
for ((round = 1; round <= ROUNDS; ++round)); do
  for s in $SHAPES; do
    for th in $THREADS; do
      d=$TMP/$round/$s/$th
      mkdir -p "$d"
      if ((round % 2 == 1)); then
        run_meshtrain "$s" "$th" "$round" "$d" | tee -a "$RESULTS"
        run_torch "$s" "$th" "$round" "$d" | tee -a "$RESULTS"
      else
        run_torch "$s" "$th" "$round" "$d" | tee -a "$RESULTS"
        run_meshtrain "$s" "$th" "$round" "$d" | tee -a "$RESULTS"
      fi
      done_runs=$((done_runs + 1))
      elapsed=$(($(date +%s) - start))
      echo "train_sweep: $done_runs/$total done, ${elapsed}s, about" \
        "$((elapsed * (total - done_runs) / done_runs))s left" >&2
    done
  done
done

echo "meshtrain: $(meshtrain_blas "$TMP"/*/*/*/m.log)"
specs=()
for s in $ALL; do specs+=("$s=${SHAPE[$s]}"); done
"$PY" - "$RESULTS" "${specs[@]}" << 'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [r for r in rows if r["impl"] == "pytorch"]
if t:
    print(f"PyTorch {t[0]['torch_version']}, BLAS {t[0]['blas']}")
print("Goal: meshtrain >= 1.5x PyTorch on every shape, at every thread count.")
shapes = {}
for arg in sys.argv[2:]:
    name, spec = arg.split("=")
    kind, *dims = spec.split()
    shapes[name] = (kind, [int(x) for x in dims])
for th in sorted({r["threads"] for r in rows}):
    print()
    print(f"threads {th}")
    print("| shape | kind | layers | width | heads | context | batch | meshtrain tok/s "
          "| PyTorch tok/s | ratio | GEMM % | attention % | element-wise % | optimizer % "
          "| outside kernels % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for s in sorted({r["shape"] for r in rows if r["threads"] == th}):
        m = [r for r in rows if r["shape"] == s and r["threads"] == th and r["impl"] == "meshtrain"]
        p = [r for r in rows if r["shape"] == s and r["threads"] == th and r["impl"] == "pytorch"]
        if not m or not p:
            continue
        mt = statistics.median(r["tokens_per_s"] for r in m)
        pt = statistics.median(r["tokens_per_s"] for r in p)
        ratios.append((mt / pt, s))
        step = statistics.median(r["step_ms_median"] for r in m)
        pct = lambda f: f"{100 * statistics.median(f(r) for r in m) / step:.0f}"
        kind, dims = shapes[s]
        print(f"| {s} | {kind} | " + " | ".join(str(d) for d in dims) +
              f" | {mt:.0f} | {pt:.0f} | {mt / pt:.2f}x | {pct(lambda r: r['kernel_ms']['gemm'])} "
              f"| {pct(lambda r: r['kernel_ms']['attention'])} "
              f"| {pct(lambda r: r['kernel_ms']['elementwise'])} "
              f"| {pct(lambda r: r['kernel_ms']['optimizer'])} "
              f"| {pct(lambda r: r['outside_kernels_ms'])} |")
    if ratios:
        lo = min(ratios)
        print(f"summary threads {th}: min {lo[0]:.2f}x ({lo[1]}), median "
              f"{statistics.median(r for r, _ in ratios):.2f}x over {len(ratios)} shapes, "
              f"{sum(r >= 1.5 for r, _ in ratios)} at >= 1.5x")
PYEOF
