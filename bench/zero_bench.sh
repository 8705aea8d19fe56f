#!/usr/bin/env bash
# ZeRO benchmark: throughput and peak memory of meshtrain's sharded data parallelism (ZeRO-1, -2
# and -3) against its own DDP and against PyTorch's sharded counterparts, 2 ranks x 1 thread.
#
# Usage: bench/zero_bench.sh [BUILD] [--configs "a b"] [--rounds R] [--steps-a N] [--steps-b N]
#                            [--warmup W] [--cases "ddp zero1 ..."] [--blas-core NAME|native]
# Cases (--cases runs a subset; the tables leave the rest out):
#   ddp       meshtrain DDP (parallel.zero_stage = 0)          \
#   zero1     meshtrain ZeRO-1 (optimizer state sharded)        | meshrun --nproc-per-node 2,
#   zero2     meshtrain ZeRO-2 (and gradients)                  | dist.backend = shm
#   zero3     meshtrain ZeRO-3 / FSDP (and parameters)         /
#   pt-zero   PyTorch DDP + ZeroRedundancyOptimizer (AdamW), gloo on the CPU: ZeRO-1/2's peer
#   pt-fsdp   PyTorch FullyShardedDataParallel, one unit per block, gloo on the CPU: ZeRO-3's peer
#             (bench/python/zero_bench_torch.py for both)
# A PyTorch variant that cannot run here (PyTorch 1.13's FSDP needs CUDA) prints its error and is
# left out of the rest of the run. A meshtrain case that fails prints the tail of its log and is
# left out of the rest of that config; the script still prints the tables, then exits 1.
# Each round runs every case once, one after the other; the order rotates by one case from round
# to round, so that no case always runs first or last. --blas-core as in bench/ddp_bench.sh.
# Figures: tokens/s aggregated over the ranks (meshtrain: global tokens per step / median step_s
# of rank 0's metrics.jsonl after the warm-up; PyTorch: the same from rank 0's step times) and
# each rank's peak resident memory (meshtrain: /usr/bin/time's maximum RSS of each worker;
# PyTorch: getrusage(RUSAGE_SELF).ru_maxrss in each rank), and the training state meshtrain
# counts on rank 0 between steps. A meshtrain run whose start line does not name the ZeRO stage
# asked for (none for DDP) counts as failed. One JSON line per measurement, then two tables:
# medians over rounds per case, and the ratios the goals name, both as the ratio of the medians
# and as the median (min-max) of the ratios within each round.
# Config a: 4 layers, n_embd 128, 4 heads, block 128, batch 8 per rank, vocab 257.
# Config b: 6 layers, n_embd 384, 6 heads, block 256, batch 4 per rank, vocab 257.
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
ALL_CASES="ddp zero1 zero2 zero3 pt-zero pt-fsdp"
CONFIGS="a b"
ROUNDS=3
STEPS_A=60
STEPS_B=20
WARMUP=3
CASES=$ALL_CASES
BLAS_CORE=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --configs) CONFIGS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps-a) STEPS_A=$2; shift 2 ;;
    --steps-b) STEPS_B=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --blas-core) BLAS_CORE=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "zero_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BENCH_NAME=zero_bench
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
check_cases "$ALL_CASES" "$CASES"
apply_blas_core "$BLAS_CORE"
for cfg in $CONFIGS; do config_shape "$cfg" > /dev/null; done
if [[ ! -x $BUILD/meshtrain || ! -x $BUILD/meshrun ]]; then
  echo "zero_bench: $BUILD/meshtrain or $BUILD/meshrun is missing; build them first" \
    "(ninja -C $BUILD meshtrain meshrun)" >&2
  exit 2
fi
if [[ ! -x /usr/bin/time ]]; then
  echo "zero_bench: /usr/bin/time is missing (it measures each rank's peak memory); run" \
    "scripts/install-deps.sh (package time)" >&2
  exit 2
fi
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
LEFT_OUT=$TMP/left_out.txt # lines: CASE CONFIG|* REASON
touch "$RESULTS" "$LEFT_OUT"
prepare_demo_data

# left_out CASE CONFIG: whether CASE was dropped for CONFIG (or for every config, "*").
left_out() { grep -q -e "^$1 $2 " -e "^$1 \* " "$LEFT_OUT"; }
RUNS_FAILED=0

# uses_stage STAGE LOG: whether the run trained with that ZeRO stage, as the start line of rank 0
# says ("...; ZeRO-N over R ranks"; nothing about ZeRO for DDP), so that a configuration key
# that was ignored cannot pass DDP off as a ZeRO stage.
uses_stage() {
  local line
  line=$(grep -m 1 'meshtrain: GPT' "$2" || true)
  if [[ -z $line ]]; then
    echo "zero_bench: no start line (meshtrain: GPT ...) in $2" >&2
    return 1
  fi
  if [[ $1 == 0 && $line == *ZeRO-* ]] || [[ $1 != 0 && $line != *"ZeRO-$1 "* ]]; then
    echo "zero_bench: asked for zero_stage $1, but the run says: ${line##*; }" >&2
    return 1
  fi
}

# run_meshtrain CASE STAGE CONFIG ROUND DIR
run_meshtrain() {
  local case=$1 stage=$2 cfg=$3 round=$4 d=$5 tps
  local block batch
  read -r _ _ _ block batch <<< "$(config_shape "$cfg")"
  tps=$((2 * batch * block))
  # ZeRO-3 gathers one transformer block at a time, as the FSDP peer wraps them.
  local unit=()
  [[ $stage == 3 ]] && unit=(--set parallel.fsdp_unit=block)
  # /usr/bin/time reports the worker's maximum RSS on its stderr, which meshrun prefixes with
  # "[rank N] "; meshrun stops a worker by its process group, so time's child stops with it.
  # shellcheck disable=SC2046
  if "$BUILD/meshrun" --nproc-per-node 2 -- /usr/bin/time -f "peak_rss_kb=%M" \
    "$BUILD/meshtrain" $(train_args "$cfg" "$d/$case") --set dist.backend=shm \
    --set parallel.zero_stage="$stage" "${unit[@]}" > "$d/$case.log" 2>&1 &&
    summarize --comm --rss-log "$d/$case.log" "$case" "$cfg" "$round" "$tps" \
      "$d/$case/metrics.jsonl" > "$d/$case.json" 2> "$d/$case.err" &&
    uses_stage "$stage" "$d/$case.log" 2> "$d/$case.err"; then
    tee -a "$RESULTS" < "$d/$case.json"
  else
    echo "zero_bench: $case (config $cfg, round $round) failed; left out of config $cfg from" \
      "here on; last lines of its log:" >&2
    tail -n 20 "$d/$case.log" >&2
    cat "$d/$case.err" >&2 2> /dev/null || true
    echo "$case $cfg failed in round $round (see the log tail above)" >> "$LEFT_OUT"
    RUNS_FAILED=1
  fi
}

# run_torch CASE VARIANT CONFIG ROUND DIR
run_torch() {
  local case=$1 variant=$2 cfg=$3 round=$4 d=$5 rc=0
  local layers embd heads block batch
  read -r layers embd heads block batch <<< "$(config_shape "$cfg")"
  "$PY" bench/python/zero_bench_torch.py --variant "$variant" --world-size 2 --threads 1 \
    --n-layer "$layers" --n-embd "$embd" --n-head "$heads" --block-size "$block" \
    --batch-size "$batch" --vocab-size 257 --steps "$(config_steps "$cfg")" --warmup "$WARMUP" \
    > "$d/$case.out" 2> "$d/$case.log" || rc=$?
  if [[ $rc == 0 ]]; then
    torch_row "$case" "$cfg" "$round" "$d/$case.out" | tee -a "$RESULTS"
  elif [[ $rc == 3 ]]; then
    local why
    why=$(grep -m 1 'cannot run' "$d/$case.log" | sed 's/^zero_bench_torch: //')
    echo "zero_bench: $case: $why; left out" >&2
    echo "$case * $why" >> "$LEFT_OUT"
  else
    echo "zero_bench: $case (config $cfg, round $round) failed; left out of config $cfg from" \
      "here on; last lines of its log:" >&2
    tail -n 20 "$d/$case.log" >&2
    echo "$case $cfg failed in round $round (see the log tail above)" >> "$LEFT_OUT"
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
      echo "zero_bench: config $cfg, round $round/$ROUNDS: $case" >&2
      case $case in
        ddp) run_meshtrain ddp 0 "$cfg" "$round" "$d" ;;
        zero1) run_meshtrain zero1 1 "$cfg" "$round" "$d" ;;
        zero2) run_meshtrain zero2 2 "$cfg" "$round" "$d" ;;
        zero3) run_meshtrain zero3 3 "$cfg" "$round" "$d" ;;
        pt-zero) run_torch pt-zero zero "$cfg" "$round" "$d" ;;
        pt-fsdp) run_torch pt-fsdp fsdp "$cfg" "$round" "$d" ;;
      esac
    done
  done
done

MT_BLAS=$(meshtrain_blas "$TMP"/*/*.log)
"$PY" - "$RESULTS" "$LEFT_OUT" "${MT_BLAS:-?}" "$CASES" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
left_out = [l.rstrip("\n").split(" ", 2) for l in open(sys.argv[2]) if l.strip()]
mt_blas = sys.argv[3]
requested = sys.argv[4].split()
names = {"ddp": "meshtrain DDP", "zero1": "meshtrain ZeRO-1", "zero2": "meshtrain ZeRO-2",
         "zero3": "meshtrain ZeRO-3", "pt-zero": "PyTorch DDP + ZeroRedundancyOptimizer",
         "pt-fsdp": "PyTorch FSDP"}
# (numerator, denominator, goal): the issue's goals.
goals = [("zero1", "ddp", 0.97), ("zero2", "ddp", 0.97), ("zero3", "ddp", 0.90),
         ("zero1", "pt-zero", 1.5), ("zero2", "pt-zero", 1.5), ("zero3", "pt-fsdp", 1.5)]
print()
print(f"meshtrain BLAS: {mt_blas}")
torch_rows = [r for r in rows if r["impl"].startswith("pytorch")]
if torch_rows:
    blas = torch_rows[0]["blas"]
    print(f"PyTorch {torch_rows[0]['torch_version']}, BLAS {blas}")
    if not blas.startswith("openblas"):
        print("WARNING: PyTorch did not run on OpenBLAS; scripts/install-deps.sh selects it")
for case, cfg, why in left_out:
    where = "every config" if cfg == "*" else f"config {cfg}"
    print(f"Left out: {names[case]} ({where}): {why}")
if not rows:
    sys.exit("zero_bench: no measurements")
print(f"Medians over rounds (rounds per config: {max(r['round'] for r in rows)}), tokens/s "
      "aggregated over 2 ranks x 1 thread; peak RSS per rank in MiB; state at rest: the")
print("parameters, gradients, optimizer state and buffers meshtrain counts on rank 0 between "
      "steps, MiB.")
print()
hdr = ["config", "case", "tok/s", "vs DDP", "peak RSS rank 0", "peak RSS rank 1",
       "state at rest", "exposed comm", "rounds"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
configs = list(dict.fromkeys(r["config"] for r in rows))
def med(cfg, case, key):
    vals = [r[key] for r in rows if r["config"] == cfg and r["case"] == case and key in r]
    return statistics.median(vals) if vals else None
for cfg in configs:
    ddp = med(cfg, "ddp", "tokens_per_s")
    for case in names:
        sel = [r for r in rows if r["config"] == cfg and r["case"] == case]
        if not sel:
            continue
        tps = med(cfg, case, "tokens_per_s")
        rss = [statistics.median(r["peak_rss_mb"][k] for r in sel) for k in range(2)]
        comm = med(cfg, case, "exposed_comm_fraction")
        rest = med(cfg, case, "at_rest_mib")
        print("| " + " | ".join([
            cfg, names[case], f"{tps:,.0f}", f"{tps / ddp:.3f}x" if ddp else "-",
            f"{rss[0]:,.0f}", f"{rss[1]:,.0f}", f"{rest:,.1f}" if rest is not None else "-",
            f"{comm:.2%}" if comm is not None else "-", str(len(sel))]) + " |")
print()
hdr = ["config", "ratio", "goal", "ratio of medians", "per round: median (min-max)", "goal met"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for cfg in configs:
    by = {(r["round"], r["case"]): r["tokens_per_s"] for r in rows if r["config"] == cfg}
    for x, y, goal in goals:
        if x not in requested or y not in requested:
            continue
        mx, my = med(cfg, x, "tokens_per_s"), med(cfg, y, "tokens_per_s")
        if mx is None or my is None:
            cells = ["-", "-", "-"]
        else:
            # The same ratio within each round (its cases ran minutes apart, not hours): steadier
            # on a host whose speed drifts.
            rs = sorted(by[(k, x)] / by[(k, y)] for k, c in by if c == x and (k, y) in by)
            cells = [f"{mx / my:.3f}x",
                     f"{statistics.median(rs):.3f}x ({rs[0]:.3f}-{rs[-1]:.3f})" if rs else "-",
                     "yes" if mx / my >= goal else "no"]
        print("| " + " | ".join([cfg, f"{names[x]} / {names[y]}", f">= {goal:.2f}x"] + cells) +
              " |")
EOF
exit "$RUNS_FAILED"
