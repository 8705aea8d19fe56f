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
case $BLAS_CORE in
  "") ;;
  native) unset OPENBLAS_CORETYPE ;;
  *) export OPENBLAS_CORETYPE=$BLAS_CORE ;;
esac
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

# The demo dataset (the text of Debian's fortunes package), prepared as scripts/demo.sh does.
DATA=data/fortunes
if [[ ! -f $DATA/train_000000.bin ]]; then
  src=/usr/share/games/fortunes
  if [[ ! -d $src ]]; then
    echo "ddp_bench: $src is missing; run scripts/install-deps.sh (package fortunes)" >&2
    exit 2
  fi
  mkdir -p data
  find -L "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort |
    xargs cat > data/fortunes.txt
  "$BUILD/meshtrain" data prepare --input data/fortunes.txt --out "$DATA" --val-fraction 0.05
fi

# model: n_layer n_embd n_head block_size batch_size
config_shape() {
  case $1 in
    a) echo "4 128 4 128 8" ;;
    b) echo "6 384 6 256 4" ;;
    *) echo "ddp_bench: unknown config $1" >&2; exit 2 ;;
  esac
}
config_steps() { [[ $1 == b ]] && echo "$STEPS_B" || echo "$STEPS_A"; }

# meshtrain train arguments for config $1 writing into directory $2.
train_args() {
  local layers embd heads block batch
  read -r layers embd heads block batch <<< "$(config_shape "$1")"
  echo train --config configs/demo.toml \
    --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads" \
    --set model.block_size="$block" --set model.vocab_size=257 --set data.batch_size="$batch" \
    --set data.dir="$DATA" --set data.val_batches=1 \
    --set train.threads=1 --set train.steps="$(config_steps "$1")" --set train.eval_interval=0 \
    --set train.sample_tokens=0 --set train.save_weights=false --set train.out_dir="$2" \
    --set ckpt.interval=0 --set ckpt.resume=false
}

# Turns the metrics.jsonl files of one measurement into a JSON line.
# summarize CASE CONFIG ROUND TOKENS_PER_STEP METRICS...
summarize() {
  "$PY" - "$WARMUP" "$@" << 'EOF'
import json, statistics, sys
warmup, case, config, rnd, tokens_per_step = int(sys.argv[1]), *sys.argv[2:5], sys.argv[5]
tokens_per_step = int(tokens_per_step)
runs = []
by_step = []
for path in sys.argv[6:]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "event" not in r and "step_s" in r and r.get("step", 0) > warmup]
    if not rows:
        sys.exit(f"ddp_bench: no timed steps in {path}")
    by_step.append({r["step"]: r["step_s"] for r in rows})
    step = statistics.median(r["step_s"] for r in rows)
    comm = statistics.median(r.get("comm_s", 0.0) for r in rows)
    runs.append({"step_s": step, "comm_s": comm, "steps": len(rows),
                 "tokens_per_s": tokens_per_step / step})
out = {"case": case, "config": config, "round": int(rnd), "impl": "meshtrain",
       "tokens_per_step": tokens_per_step, "runs": len(runs),
       "step_ms_median": [r["step_s"] * 1e3 for r in runs],
       "tokens_per_s": sum(r["tokens_per_s"] for r in runs)}
if case == "b" and len(by_step) == 2:
    # What any lock-step scheme could reach on this host: a synchronous step lasts as long as the
    # slower rank's, so pair the two independent runs step by step and take the slower of each
    # pair (the runs start together, so step k of both ran at about the same time).
    common = sorted(set(by_step[0]) & set(by_step[1]))
    slower = [max(by_step[0][k], by_step[1][k]) for k in common]
    out["lockstep_tokens_per_s"] = 2 * tokens_per_step / statistics.median(slower)
    out["step_cv"] = [statistics.pstdev(d.values()) / statistics.mean(d.values())
                      for d in by_step]
if case == "c":
    out["comm_ms_median"] = runs[0]["comm_s"] * 1e3
    out["exposed_comm_fraction"] = runs[0]["comm_s"] / runs[0]["step_s"]
print(json.dumps(out))
EOF
}

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
      summarize b "$cfg" "$round" "$tps" "$d/b0/metrics.jsonl" "$d/b1/metrics.jsonl" |
        tee -a "$RESULTS"
    fi
    # (c) meshtrain DDP, two ranks of one thread; rank 0's metrics count the global batch.
    if [[ $CASES == *c* ]]; then
      # shellcheck disable=SC2046
      "$BUILD/meshrun" --nproc-per-node 2 "${C_BIND[@]}" -- "$BUILD/meshtrain" $(train_args "$cfg" "$d/c") \
        --set dist.backend=shm "${C_SETS[@]}" > "$d/c.log" 2>&1 || fail "(c)" "$d/c.log"
      summarize c "$cfg" "$round" $((2 * tps)) "$d/c/metrics.jsonl" | tee -a "$RESULTS"
    fi
    # (d) PyTorch DDP, two ranks of one thread, gloo.
    if [[ $CASES == *d* ]]; then
      "$PY" bench/python/ddp_bench_torch.py --world-size 2 --threads 1 --n-layer "$layers" \
        --n-embd "$embd" --n-head "$heads" --block-size "$block" --batch-size "$batch" \
        --vocab-size 257 --steps "$(config_steps "$cfg")" --warmup "$WARMUP" \
        > "$d/d.out" 2> "$d/d.log" || fail "(d)" "$d/d.log"
      "$PY" -c 'import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
r["model"] = r.pop("config")
r.update(case="d", config=sys.argv[2], round=int(sys.argv[3]))
print(json.dumps(r))' "$d/d.out" "$cfg" "$round" | tee -a "$RESULTS"
    fi
  done
done

[[ $BIND == 1 ]] && echo "(b) and (c) ran bound to cores: $HALF0 and $HALF1 ((a) and (d) unbound)"
# The kernels OpenBLAS chose (or OPENBLAS_CORETYPE forced) set most of the step time, for both sides.
MT_BLAS=$(cat "$TMP"/*/*.log 2> /dev/null | grep -o '; BLAS [^;]*' | head -n 1 | sed 's/^; BLAS //' || true)
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
