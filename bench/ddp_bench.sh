#!/usr/bin/env bash
# Data-parallel benchmark: how close meshtrain's DDP comes to the throughput that two ranks could
# reach on this host without any communication, and how it compares with PyTorch DDP.
#
# Usage: bench/ddp_bench.sh [BUILD] [--configs "a b"] [--rounds R] [--steps-a N] [--steps-b N]
#                           [--warmup W] [--cases abcd] [--c-set KEY=VALUE]... [--bind]
#                           [--blas-core NAME|native]
# --cases runs a subset (e.g. "bc" for the DDP efficiency alone); the table leaves the rest out.
# --c-set adds a config override to (c) only (e.g. dist.gradient_as_bucket_view=false), to compare
# reducer settings against the same ceiling.
# --blas-core sets OPENBLAS_CORETYPE (which kernels OpenBLAS runs) for every case, meshtrain and
# PyTorch alike; "native" unsets it, so that OpenBLAS picks the kernels for this CPU itself. Without
# it every case inherits the environment. The table's footer says which kernels each side ran.
# --bind runs each rank on its own half of the cores: (b)'s two runs under taskset, (c) under
# meshrun --bind-cores-to-rank; (a) and (d) stay unbound.
# For each GPT config, each round runs, one after the other:
#   (a) meshtrain, 1 rank x 1 thread;
#   (b) two independent single-rank meshtrain runs at the same time (no communication): their
#       summed tokens/s is the ceiling data parallelism can reach on this host;
#   (c) meshtrain DDP, 2 ranks x 1 thread (meshrun, shm backend);
#   (d) PyTorch DDP, 2 ranks x 1 thread, gloo backend (bench/python/ddp_bench_torch.py).
# meshtrain figures come from the run's metrics.jsonl: tokens/s = global tokens per step / median
# step_s over the steps after the warm-up; the exposed communication fraction of (c) is
# median(comm_s) / median(step_s) on rank 0. (b) also gives its lock-step ceiling: the two runs'
# step times paired by step number, each pair lasting as long as its slower step, which is what a
# synchronous scheme gets from the same two processes. One JSON line per measurement, then a table
# of the medians over rounds.
# Config a: 4 layers, n_embd 128, 4 heads, block 128, batch 8 per rank, vocab 257.
# Config b: 6 layers, n_embd 384, 6 heads, block 256, batch 4 per rank, vocab 257.
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
CONFIGS="a"
ROUNDS=2
STEPS_A=60
STEPS_B=20
WARMUP=3
C_SETS=()
CASES=abcd
BIND=0
BLAS_CORE=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --configs) CONFIGS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps-a) STEPS_A=$2; shift 2 ;;
    --steps-b) STEPS_B=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --c-set) C_SETS+=(--set "$2"); shift 2 ;;
    --bind) BIND=1; shift ;;
    --blas-core) BLAS_CORE=$2; shift 2 ;;
    *) echo "ddp_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=ddp_bench
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
apply_blas_core "$BLAS_CORE"
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
# --bind: the two halves of the usable cores, as meshrun --bind-cores-to-rank splits them.
B_PIN=(); B_PIN1=(); C_BIND=()
if [[ $BIND == 1 ]]; then
  read -r HALF0 HALF1 <<< "$("$PY" -c 'import os
c = sorted(os.sched_getaffinity(0)); k = len(c) // 2
assert k >= 1, "--bind needs at least 2 usable cores"
print(",".join(map(str, c[:k])), ",".join(map(str, c[k:2 * k])))')"
  B_PIN=(taskset -c "$HALF0"); B_PIN1=(taskset -c "$HALF1"); C_BIND=(--bind-cores-to-rank)
fi
prepare_demo_data

fail() {
  echo "ddp_bench: $1 failed; last lines of its log:" >&2
  tail -n 20 "$2" >&2
  exit 1
}

for cfg in $CONFIGS; do
  read -r layers embd heads block batch <<< "$(config_shape "$cfg")"
  tps=$((batch * block))
  for ((round = 1; round <= ROUNDS; ++round)); do
    d=$TMP/$cfg-$round
    mkdir -p "$d"
    # (a) one rank, one thread.
    if [[ $CASES == *a* ]]; then
      # shellcheck disable=SC2046
      "$BUILD/meshtrain" $(train_args "$cfg" "$d/a") > "$d/a.log" 2>&1 || fail "(a)" "$d/a.log"
      summarize a "$cfg" "$round" "$tps" "$d/a/metrics.jsonl" | tee -a "$RESULTS"
    fi
    # (b) two independent single-rank runs at the same time.
    if [[ $CASES == *b* ]]; then
      # shellcheck disable=SC2046
      "${B_PIN[@]}" "$BUILD/meshtrain" $(train_args "$cfg" "$d/b0") > "$d/b0.log" 2>&1 &
      p0=$!
      # shellcheck disable=SC2046
      "${B_PIN1[@]}" "$BUILD/meshtrain" $(train_args "$cfg" "$d/b1") > "$d/b1.log" 2>&1 &
      p1=$!
      wait "$p0" || fail "(b) run 0" "$d/b0.log"
      wait "$p1" || fail "(b) run 1" "$d/b1.log"
      summarize --lockstep b "$cfg" "$round" "$tps" "$d/b0/metrics.jsonl" "$d/b1/metrics.jsonl" |
        tee -a "$RESULTS"
    fi
    # (c) meshtrain DDP, two ranks of one thread; rank 0's metrics count the global batch.
    if [[ $CASES == *c* ]]; then
      # shellcheck disable=SC2046
      "$BUILD/meshrun" --nproc-per-node 2 "${C_BIND[@]}" -- "$BUILD/meshtrain" $(train_args "$cfg" "$d/c") \
        --set dist.backend=shm "${C_SETS[@]}" > "$d/c.log" 2>&1 || fail "(c)" "$d/c.log"
      summarize --comm c "$cfg" "$round" $((2 * tps)) "$d/c/metrics.jsonl" | tee -a "$RESULTS"
    fi
    # (d) PyTorch DDP, two ranks of one thread, gloo.
    if [[ $CASES == *d* ]]; then
      "$PY" bench/python/ddp_bench_torch.py --world-size 2 --threads 1 --n-layer "$layers" \
        --n-embd "$embd" --n-head "$heads" --block-size "$block" --batch-size "$batch" \
        --vocab-size 257 --steps "$(config_steps "$cfg")" --warmup "$WARMUP" \
        > "$d/d.out" 2> "$d/d.log" || fail "(d)" "$d/d.log"
      torch_row d "$cfg" "$round" "$d/d.out" | tee -a "$RESULTS"
    fi
  done
done

[[ $BIND == 1 ]] && echo "(b) and (c) ran bound to cores: $HALF0 and $HALF1 ((a) and (d) unbound)"
# The kernels OpenBLAS chose (or OPENBLAS_CORETYPE forced) set most of the step time, for both sides.
MT_BLAS=$(meshtrain_blas "$TMP"/*/*.log)
echo "meshtrain BLAS: ${MT_BLAS:-?}"
"$PY" - "$RESULTS" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("Goals: (c) >= 98% of (b); exposed comm < 3% of step time; (c) >= 1.5x (d).")
print("(b) lock-step: the two independent runs paired step by step, each pair as slow as its")
print("slower run: the most that any synchronous data parallelism can reach on this host.")
torch_rows = [r for r in rows if r["case"] == "d"]
if torch_rows:
    print(f"PyTorch {torch_rows[0]['torch_version']}, BLAS {torch_rows[0]['blas']}")
print(f"Medians over rounds (rounds per config: "
      f"{max(r['round'] for r in rows)}), tokens/s aggregated over ranks.")
hdr = ["config", "(a) tok/s", "(b) tok/s", "(b) lock-step", "(c) tok/s", "(d) tok/s", "(c)/(b)",
       "(d)/(b)", "(c)/(b) lock-step", "exposed comm (c)", "(c)/(d)", "(c)/(b) per round",
       "(c)/(d) per round"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for cfg in dict.fromkeys(r["config"] for r in rows):
    med = {}
    for case in "abcd":
        vals = [r["tokens_per_s"] for r in rows if r["config"] == cfg and r["case"] == case]
        med[case] = statistics.median(vals) if vals else None
    comms = [r["exposed_comm_fraction"] for r in rows if r["config"] == cfg and r["case"] == "c"]
    locks = [r["lockstep_tokens_per_s"] for r in rows
             if r["config"] == cfg and r["case"] == "b" and "lockstep_tokens_per_s" in r]
    med["l"] = statistics.median(locks) if locks else None
    def ratio(x, y, fmt):
        return format(med[x] / med[y], fmt) if med[x] and med[y] else "-"
    # The same ratios within each round (its cases ran minutes apart, not hours): steadier on a
    # host whose speed drifts; median (min-max) over rounds.
    def per_round(x, y, fmt):
        by = {(r["round"], r["case"]): r["tokens_per_s"] for r in rows if r["config"] == cfg}
        rs = sorted(by[(k, x)] / by[(k, y)] for k, c in by if c == x and (k, y) in by)
        if not rs:
            return "-"
        return (f"{format(statistics.median(rs), fmt)} "
                f"({format(rs[0], fmt)}-{format(rs[-1], fmt)})")
    cells = [cfg] + [f"{med[c]:.0f}" if med[c] else "-" for c in "ablcd"] + [
        ratio("c", "b", ".1%"), ratio("d", "b", ".1%"), ratio("c", "l", ".1%"),
        f"{statistics.median(comms):.2%}" if comms else "-", ratio("c", "d", ".2f") + "x",
        per_round("c", "b", ".1%"), per_round("c", "d", ".2f")]
    print("| " + " | ".join(cells) + " |")
EOF
