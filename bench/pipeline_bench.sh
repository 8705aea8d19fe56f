#!/usr/bin/env bash
# Pipeline benchmark: meshtrain's pipeline (parallel.pp = 2, 2 ranks x 1 thread, shm) against one
# rank x 1 thread running the same micro-batches with gradient accumulation, and against PyTorch
# 1.13's torch.distributed.pipeline.sync.Pipe (GPipe) on the CPU (2 partitions, a worker thread
# each, 1 intra-op thread).
#
# Usage: bench/pipeline_bench.sh [BUILD] [--configs "a deep"] [--ms "4 8 16"] [--rounds R]
#                                [--steps N] [--warmup W] [--schedules "gpipe 1f1b interleaved"]
#                                [--batch S] [--partition flops|params]
# Configs (tied embeddings off everywhere: Pipe cannot share a parameter between partitions):
#   a     4 layers, n_embd 128, 4 heads, block 128        b   6 layers, n_embd 384, 6 heads,
#   deep  12 layers, n_embd 128, 4 heads, block 128           block 256
# Every case trains on S sequences per step (--batch; default: 8, or the largest M when that is
# more, so that M = 16 runs): the pipeline as data.batch_size S cut into
# M = parallel.micro_batches micro-batches; one rank as data.batch_size S/M x
# train.grad_accum_steps M; Pipe as a batch of S in M chunks. Every M must divide S.
# The pipeline cuts the model into stages by --partition (parallel.partition, default flops:
# forward and backward FLOPs per token; params: parameter counts); the table names it.
# Each round runs every case once; the order rotates from round to round.
# Figures, one JSON line per measurement, then a table of medians over rounds:
#   tokens_per_s  tokens per step / median step_s of rank 0's metrics.jsonl after the warm-up
#                 (PyTorch: the same from its own step times);
#   bubble        per stage, from the trace clock (train.trace): for each timed step, the window
#                 from the first forward on any stage to the last backward on any stage, and the
#                 stage's idle fraction of it (1 - its forward and backward time / the window;
#                 waiting on transfers counts as idle), median over steps; next to the formula
#                 (P-1)/(M+P-1), or (P-1)/(v*M+P-1) for interleaved (v = 2 chunks per rank);
#   ratios        pp tokens/s over one rank's, next to the goal 0.9 x 2 x (1 - formula bubble);
#                 meshtrain pp (gpipe) over Pipe;
#   ceiling       two one-rank runs at the same time (no communication), their step times paired
#                 step by step, each pair as slow as its slower step: what any two ranks in lock
#                 step get from this host's two cores at that moment (ddp_bench's (b)). A
#                 pipeline can reach that ceiling x (1 - formula bubble); the table gives pp
#                 tokens/s over it, within the round, next to the goal 0.9 x (1 - formula). On a
#                 host whose cores run unequal or are shared, this is the goal that still
#                 separates the pipeline's own costs from the host's.
set -euo pipefail
BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
CONFIGS="a"
MS="4 8"
ROUNDS=3
STEPS=20
WARMUP=3
SCHEDULES="gpipe 1f1b interleaved"
BATCH=
PARTITION=flops
while [[ $# -gt 0 ]]; do
  case $1 in
    --configs) CONFIGS=$2; shift 2 ;;
    --ms) MS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --schedules) SCHEDULES=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --partition) PARTITION=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $PARTITION != flops && $PARTITION != params ]]; then
  echo "pipeline_bench: --partition $PARTITION is not flops or params" >&2
  exit 2
fi
if [[ -z $BATCH ]]; then
  BATCH=8
  for m in $MS; do ((m > BATCH)) && BATCH=$m; done
fi
if ! [[ $BATCH =~ ^[1-9][0-9]*$ ]]; then
  echo "pipeline_bench: --batch $BATCH is not a positive number of sequences" >&2
  exit 2
fi
for m in $MS; do
  if ! [[ $m =~ ^[1-9][0-9]*$ ]] || ((BATCH % m != 0)); then
    echo "pipeline_bench: --ms $m does not divide the $BATCH sequences of a step (--batch);" \
      "use a divisor of it or raise --batch" >&2
    exit 2
  fi
done
BUILD=$(cd "$BUILD" && pwd)
cd "$(dirname "$0")/.."
# shellcheck disable=SC2034 # read by bench/lib/train_bench_common.sh
BENCH_NAME=pipeline_bench
# shellcheck source=bench/lib/train_bench_common.sh
source bench/lib/train_bench_common.sh
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS=$TMP/results.jsonl
touch "$RESULTS"
prepare_demo_data
FAILED=0

# model arguments of a config: n_layer n_embd n_head block_size
shape_of() {
  case $1 in
    a) echo "4 128 4 128" ;;
    b) echo "6 384 6 256" ;;
    deep) echo "12 128 4 128" ;;
    *) echo "pipeline_bench: unknown config $1 (a, b, deep)" >&2; exit 2 ;;
  esac
}

# meshtrain train arguments: CONFIG DIR BATCH ACCUM
mt_args() {
  local layers embd heads block
  read -r layers embd heads block <<< "$(shape_of "$1")"
  echo train --config configs/demo.toml \
    --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads" \
    --set model.block_size="$block" --set model.vocab_size=257 \
    --set model.tie_embeddings=false --set model.dropout=0 \
    --set data.batch_size="$3" --set train.grad_accum_steps="$4" \
    --set data.dir="$DATA" --set data.val_batches=1 \
    --set train.threads=1 --set train.steps="$STEPS" --set train.eval_interval=0 \
    --set train.sample_tokens=0 --set train.save_weights=false --set train.out_dir="$2" \
    --set ckpt.interval=0 --set ckpt.resume=false
}

# The JSON line of one meshtrain measurement: V CASE CONFIG ROUND M DIR [TRACE0 TRACE1]
measure() {
  "$PY" - "$WARMUP" "$@" << 'EOF'
import json, os, statistics, sys
warmup, V, case, config, rnd, M, d = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:8]
traces = sys.argv[8:]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
rows = [r for r in rows if "step_s" in r and r.get("step", 0) > warmup]
if not rows:
    sys.exit(f"pipeline_bench: no timed steps in {d}/metrics.jsonl")
step = statistics.median(r["step_s"] for r in rows)
out = {"case": case, "config": config, "round": int(rnd), "impl": "meshtrain",
       "micro_batches": int(M), "step_ms_median": step * 1e3}
meta = json.load(open(f"{d}/tokens.json"))
out["tokens_per_step"] = meta["tokens_per_step"]
out["tokens_per_s"] = meta["tokens_per_step"] / step
if traces:
    P = len(traces)
    steps, work = {}, {}  # rank -> [(start, end, step)]; (rank, step) -> busy us
    first, last = {}, {}  # step -> earliest forward start / latest backward end over the stages
    for rank, path in enumerate(traces):
        ev = json.load(open(path))["traceEvents"]
        spans = [(e["ts"], e["ts"] + e["dur"], int(e["args"]["step"])) for e in ev
                 if e.get("cat") == "step" and e.get("name") == "step"]
        for e in ev:
            if e.get("cat") != "pipeline" or e["name"] not in ("forward", "backward"):
                continue
            s, t = e["ts"], e["ts"] + e["dur"]
            k = next((k for a, b, k in spans if a <= s and t <= b), None)
            if k is None or k <= warmup:
                continue
            work[(rank, k)] = work.get((rank, k), 0) + e["dur"]
            first[k] = min(first.get(k, s), s)
            last[k] = max(last.get(k, t), t)
    idle = []
    for rank in range(P):
        fr = [1 - work.get((rank, k), 0) / (last[k] - first[k]) for k in first
              if last[k] > first[k]]
        idle.append(statistics.median(fr) if fr else None)
    out["bubble"] = idle
    out["virtual_stages"] = V
    out["partition"] = os.environ["BENCH_PARTITION"]
    out["bubble_formula"] = (P - 1) / (V * int(M) + P - 1)
print(json.dumps(out))
EOF
}

# run_pp SCHEDULE CONFIG ROUND M DIR
run_pp() {
  local sched=$1 cfg=$2 round=$3 m=$4 d=$5 case="pp-$1-M$4" block v=1
  read -r _ _ _ block <<< "$(shape_of "$cfg")"
  [[ $sched == interleaved ]] && v=2
  mkdir -p "$d/$case"
  echo "{\"tokens_per_step\": $((BATCH * block))}" > "$d/$case/tokens.json"
  # shellcheck disable=SC2046
  if "$BUILD/meshrun" --nproc-per-node 2 -- "$BUILD/meshtrain" \
    $(mt_args "$cfg" "$d/$case" "$BATCH" 1) --set parallel.partition="$PARTITION" \
    --set dist.backend=shm --set parallel.pp=2 --set parallel.schedule="$sched" \
    --set parallel.micro_batches="$m" --set parallel.virtual_stages="$v" \
    --set train.trace="$d/$case/trace_{rank}.json" \
    > "$d/$case.log" 2>&1 &&
    grep -q "pipeline $sched over 2 stages" "$d/$case.log" &&
    BENCH_PARTITION=$PARTITION measure "$v" "$case" "$cfg" "$round" "$m" "$d/$case" \
      "$d/$case/trace_0.json" "$d/$case/trace_1.json" > "$d/$case.json" 2> "$d/$case.err"; then
    tee -a "$RESULTS" < "$d/$case.json"
  else
    echo "pipeline_bench: $case (config $cfg, round $round) failed; last lines of its log:" >&2
    tail -n 20 "$d/$case.log" >&2
    cat "$d/$case.err" >&2 2> /dev/null || true
    FAILED=1
  fi
}

# run_one CONFIG ROUND M DIR: one rank x 1 thread, the same micro-batches accumulated
run_one() {
  local cfg=$1 round=$2 m=$3 d=$4 case="one-M$3" block
  read -r _ _ _ block <<< "$(shape_of "$cfg")"
  mkdir -p "$d/$case"
  echo "{\"tokens_per_step\": $((BATCH * block))}" > "$d/$case/tokens.json"
  # shellcheck disable=SC2046
  if "$BUILD/meshtrain" $(mt_args "$cfg" "$d/$case" $((BATCH / m)) "$m") > "$d/$case.log" 2>&1 &&
    measure 1 "$case" "$cfg" "$round" "$m" "$d/$case" > "$d/$case.json" 2> "$d/$case.err"; then
    tee -a "$RESULTS" < "$d/$case.json"
  else
    echo "pipeline_bench: $case (config $cfg, round $round) failed; last lines of its log:" >&2
    tail -n 20 "$d/$case.log" >&2
    FAILED=1
  fi
}

# run_ceiling CONFIG ROUND M DIR: two copies of the one-rank case at the same time, paired step
# by step (summarize --lockstep)
run_ceiling() {
  local cfg=$1 round=$2 m=$3 d=$4 case="ceiling-M$3" block p0 p1 ok=1
  read -r _ _ _ block <<< "$(shape_of "$cfg")"
  mkdir -p "$d/$case"
  # shellcheck disable=SC2046
  "$BUILD/meshtrain" $(mt_args "$cfg" "$d/$case/0" $((BATCH / m)) "$m") > "$d/$case.0.log" 2>&1 &
  p0=$!
  # shellcheck disable=SC2046
  "$BUILD/meshtrain" $(mt_args "$cfg" "$d/$case/1" $((BATCH / m)) "$m") > "$d/$case.1.log" 2>&1 &
  p1=$!
  wait "$p0" || ok=0
  wait "$p1" || ok=0
  if [[ $ok == 1 ]] && summarize --lockstep "$case" "$cfg" "$round" $((BATCH * block)) \
    "$d/$case/0/metrics.jsonl" "$d/$case/1/metrics.jsonl" > "$d/$case.json" 2> "$d/$case.err"; then
    tee -a "$RESULTS" < "$d/$case.json"
  else
    echo "pipeline_bench: $case (config $cfg, round $round) failed; last lines of its logs:" >&2
    tail -n 10 "$d/$case.0.log" "$d/$case.1.log" >&2
    cat "$d/$case.err" >&2 2> /dev/null || true
    FAILED=1
  fi
}

TORCH_OK=1
# run_torch CONFIG ROUND M DIR
run_torch() {
  local cfg=$1 round=$2 m=$3 d=$4 case="torch-pipe-M$3" layers embd heads block rc=0
  [[ $TORCH_OK == 1 ]] || return 0
  read -r layers embd heads block <<< "$(shape_of "$cfg")"
  "$PY" bench/python/pipeline_bench_torch.py --stages 2 --micro-batches "$m" --threads 1 \
    --n-layer "$layers" --n-embd "$embd" --n-head "$heads" --block-size "$block" \
    --batch-size "$BATCH" --steps "$STEPS" --warmup "$WARMUP" > "$d/$case.out" 2> "$d/$case.log" || rc=$?
  if [[ $rc == 0 ]]; then
    torch_row "$case" "$cfg" "$round" "$d/$case.out" | tee -a "$RESULTS"
  else
    echo "pipeline_bench: PyTorch Pipe left out: $(grep -m 1 'cannot run' "$d/$case.log" ||
      tail -n 1 "$d/$case.log")" >&2
    TORCH_OK=0
  fi
}

for cfg in $CONFIGS; do
  shape_of "$cfg" > /dev/null
  cases=()
  for m in $MS; do
    cases+=("one $m" "ceiling $m")
    for s in $SCHEDULES; do cases+=("pp $m $s"); done
    cases+=("torch $m")
  done
  for ((round = 1; round <= ROUNDS; ++round)); do
    d=$TMP/$cfg-$round
    mkdir -p "$d"
    n=${#cases[@]}
    for ((i = 0; i < n; ++i)); do
      read -r kind m s <<< "${cases[$(((i + round - 1) % n))]}"
      case $kind in
        one) run_one "$cfg" "$round" "$m" "$d" ;;
        ceiling) run_ceiling "$cfg" "$round" "$m" "$d" ;;
        pp) run_pp "$s" "$cfg" "$round" "$m" "$d" ;;
        torch) run_torch "$cfg" "$round" "$m" "$d" ;;
      esac
    done
  done
done

"$PY" - "$RESULTS" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
def fmt(x, p="{:.0f}"):
    return "-" if x is None else p.format(x)
cuts = sorted({r["partition"] for r in rows if "partition" in r})
print()
print(f"pipeline stages cut by: {', '.join(cuts) or '-'}")
print("| config | M | case | tokens/s | bubble stage 0 / 1 (trace) | formula |"
      " vs one rank (median of rounds' ratios) | goal 0.9x2x(1-bubble) |"
      " vs lock-step ceiling x (1-bubble) | goal | vs PyTorch Pipe |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
by = {}
for r in rows:
    by.setdefault((r["config"], r["case"]), []).append(r)
for (cfg, case), rs in sorted(by.items()):
    m = case.split("-M")[-1]
    tps = med(r["tokens_per_s"] for r in rs)
    one = med(r["tokens_per_s"] for r in by.get((cfg, f"one-M{m}"), []))
    pipe = med(r["tokens_per_s"] for r in by.get((cfg, f"torch-pipe-M{m}"), []))
    bub, formula, ratio, goal, vs_pipe, vs_ceil, ceil_goal = "-", "-", "-", "-", "-", "-", "-"
    if case.startswith("ceiling-"):
        # The lock-step ceiling stands in the tokens/s column for this case.
        tps = med(r.get("lockstep_tokens_per_s") for r in rs)
    if case.startswith("pp-"):
        b0 = med(r["bubble"][0] for r in rs)
        b1 = med(r["bubble"][1] for r in rs)
        f = rs[0]["bubble_formula"]
        bub = f"{fmt(b0 * 100 if b0 is not None else None, '{:.1f}')}% / " \
              f"{fmt(b1 * 100 if b1 is not None else None, '{:.1f}')}%"
        formula = f"{f * 100:.1f}%"
        # Paired within each round (the runs of a round ran minutes apart at most), then the
        # median: less exposed to a machine whose load changes between rounds.
        ones = {r["round"]: r["tokens_per_s"] for r in by.get((cfg, f"one-M{m}"), [])}
        rat = [r["tokens_per_s"] / ones[r["round"]] for r in rs if r["round"] in ones]
        if rat:
            ratio = f"{statistics.median(rat):.2f}x ({min(rat):.2f}-{max(rat):.2f})"
        goal = f"{0.9 * 2 * (1 - f):.2f}x"
        ceils = {r["round"]: r["lockstep_tokens_per_s"]
                 for r in by.get((cfg, f"ceiling-M{m}"), []) if "lockstep_tokens_per_s" in r}
        rat = [r["tokens_per_s"] / (ceils[r["round"]] * (1 - f)) for r in rs if r["round"] in ceils]
        if rat:
            vs_ceil = f"{statistics.median(rat):.2f} ({min(rat):.2f}-{max(rat):.2f})"
        ceil_goal = "0.90"
        pipes = {r["round"]: r["tokens_per_s"] for r in by.get((cfg, f"torch-pipe-M{m}"), [])}
        rat = [r["tokens_per_s"] / pipes[r["round"]] for r in rs if r["round"] in pipes]
        if rat:
            vs_pipe = f"{statistics.median(rat):.2f}x ({min(rat):.2f}-{max(rat):.2f})"
    print(f"| {cfg} | {m} | {case} | {fmt(tps)} | {bub} | {formula} | {ratio} | {goal} |"
          f" {vs_ceil} | {ceil_goal} | {vs_pipe} |")
EOF
exit $FAILED
